"""`vllm-operator crd`: print a generated CRD or the chart template of the built-in workload classes."""

from __future__ import annotations

import sys

from vllm_operator.api import crdgen
from vllm_operator.planning import classfile

USAGE = ("usage: vllm-operator crd [--workload-class | --builtin-classes]   (prints the generated VLLMDeployment "
         "CRD, the VLLMWorkloadClass CRD, or the chart template of the built-in classes)")


def main(argv: list[str]) -> int:
    if argv and argv[0] in {"-h", "--help"}:
        print(USAGE)
        return 0
    outputs = {"--workload-class": crdgen.class_crd_yaml, "--builtin-classes": classfile.builtin_classes_yaml}
    if len(argv) > 1 or (argv and argv[0] not in outputs):
        print(f"vllm-operator crd: unexpected arguments {argv}; {USAGE}", file=sys.stderr)
        return 2
    sys.stdout.write(outputs[argv[0]]() if argv else crdgen.crd_yaml())
    return 0
