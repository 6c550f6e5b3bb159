"""`vllm-operator render`: print the manifests the operator would apply for a VLLMDeployment, for GitOps review.

Runs the same `plan()` and `render()` as the operator (offline, so `accelerator.type: auto` needs `--gpu`) and prints
multi-document YAML on stdout, keys sorted, multi-line strings such as `router.json` as literal blocks, so a diff of
two renders shows exactly what a spec change does. Plan warnings go to stderr. This module is the renderer's only I/O
shell. Exit codes: 0 = rendered; 2 = refused or unreadable input, with one line on stderr naming the file and the
field — never a traceback; 1 = an internal error (a bug), also as one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from vllm_operator.api.errors import SpecError
from vllm_operator.api.spec import ModelFacts
from vllm_operator.images import DEFAULT_IMAGES, ImageDefaults
from vllm_operator.planning.cli_inputs import (
    Parser,
    Planned,
    UsageError,
    add_input_arguments,
    display_name,
    facts_missing,
    input_file,
    load_documents,
    plan_documents,
    plan_input,
)
from vllm_operator.rendering import RenderOptions, render

__all__ = ["load_documents", "main", "manifests_json", "manifests_yaml", "render_documents"]

PROG = "vllm-operator render"


def _labels(text: str) -> dict[str, str]:
    """`k=v,k2=v2` -> dict; '' -> {}."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE[,KEY=VALUE...], got {item!r}")
        out[key] = value
    return out


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description="Render a VLLMDeployment to the manifests the operator would apply.")
    add_input_arguments(p, "rendered")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml",
                   help="multi-document YAML (default) or one JSON v1 List, as kubectl prints them")
    p.add_argument("--scraper-pod-labels", type=_labels, metavar="K=V,...",
                   help="labels of the metrics scraper's pods the engines' NetworkPolicy admits "
                        "(default app.kubernetes.io/name=prometheus; '' = any pod)")
    p.add_argument("--scraper-namespace-labels", type=_labels, metavar="K=V,...",
                   help="labels of the namespaces the metrics scraper runs in (default: any namespace)")
    p.add_argument("--prometheus-url", default=None, metavar="URL",
                   help="the Prometheus the KEDA ScaledObjects of pools with autoscaling query, as the operator's "
                        "--prometheus-url (without it those pools get no ScaledObject)")
    return p


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings (router.json) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def manifests_yaml(objects: Sequence[dict[str, Any]]) -> str:
    """Multi-document YAML of rendered objects (keys sorted, stable line width)."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=120,
                         allow_unicode=True, explicit_start=True)


def manifests_json(objects: Sequence[dict[str, Any]]) -> str:
    """The objects as one `v1 List` in JSON, the shape `kubectl get -o json` prints for several objects."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}, indent=2, sort_keys=True) + "\n"


def render_planned(planned: Sequence[Planned], options: RenderOptions | None = None,
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """(objects of every planned document in turn, plan warnings)."""
    objects: list[dict[str, Any]] = []
    warnings: list[str] = []
    for item in planned:
        the_plan = item.plan
        who = f"{the_plan.namespace}/{the_plan.name}"
        warnings += [f"{who}: {w}" for w in the_plan.warnings]
        warnings += [f"{who} pool {p.name}: {w}" for p in the_plan.pools.values() for w in p.warnings]
        if facts_missing(item):
            assert item.spec.model.facts is not None
            warnings.append(f"{who}: rendered from --model-config; the operator plans from the spec, so add "
                            f"spec.model.facts {json.dumps(item.spec.model.facts.to_wire(), sort_keys=True)} "
                            "(`vllm-operator plan --model-config` prints it as YAML)")
        scaled = [p.name for p in the_plan.pools.values() if p.enabled and p.autoscaling is not None]
        if scaled and not (options and options.prometheus_url):
            warnings.append(f"{who}: pools {', '.join(scaled)} set autoscaling, but without --prometheus-url no KEDA "
                            "ScaledObject was rendered (the operator renders them with its own --prometheus-url)")
        objects += render(the_plan, options=options)
    return objects, warnings


def render_documents(docs: Sequence[Any], *, gpu: str | None = None, engine_version: str | None = None,
                     options: RenderOptions | None = None, facts: ModelFacts | None = None,
                     images: ImageDefaults = DEFAULT_IMAGES) -> tuple[list[dict[str, Any]], list[str]]:
    """(objects of every document in turn, plan warnings); SpecError for a refused document. The plans use `images`
    (repository and pull secrets), as the operator's do."""
    return render_planned(plan_documents(docs, gpu=gpu, engine_version=engine_version, facts=facts, images=images),
                          options)


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
        path = input_file(args)
    except UsageError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    options = RenderOptions()
    if args.scraper_pod_labels is not None:
        options = dataclasses.replace(options, scraper_pod_labels=args.scraper_pod_labels)
    if args.scraper_namespace_labels is not None:
        options = dataclasses.replace(options, scraper_namespace_labels=args.scraper_namespace_labels or None)
    if args.prometheus_url:
        options = dataclasses.replace(options, prometheus_url=args.prometheus_url)
    where = display_name(path)
    try:
        objects, warnings = render_planned(plan_input(path, args), options)
    except SpecError as err:
        print(f"{PROG}: {where}: {err}".replace("\n", " "), file=sys.stderr)
        return 2
    except Exception as err:  # the CLI promises one line, never a traceback
        print(f"{PROG}: {where}: internal error (please report): {type(err).__name__}: {err}"
              .replace("\n", " "), file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"{PROG}: warning: {warning}".replace("\n", " "), file=sys.stderr)
    try:
        sys.stdout.write(manifests_json(objects) if args.output == "json" else manifests_yaml(objects))
        sys.stdout.flush()
    except BrokenPipeError:  # `render ... | head`: the reader left; not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
    return 0
