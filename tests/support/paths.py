"""Repository paths tests share."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CRD_FILE = ROOT / "crds" / "vllm-operator.dev_vllmdeployments.yaml"
CLASS_CRD_FILE = ROOT / "crds" / "vllm-operator.dev_vllmworkloadclasses.yaml"
CHART_CRD_FILE = ROOT / "charts" / "vllm-operator" / "crds" / "vllm-operator.dev_vllmdeployments.yaml"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))
