"""docs/health.md must keep up with the code: every state with its description, every wrapper exit code."""

from tests.support.paths import ROOT
from vllm_operator import constants
from vllm_operator.health.diagnose import DESCRIPTIONS, State

DOC = (ROOT / "docs" / "health.md").read_text()


def test_every_state_and_its_description_is_documented() -> None:
    missing = [s.value for s in State if f"| {s.value} | {DESCRIPTIONS[s]} |" not in DOC]
    assert not missing, f"docs/health.md lacks (or has stale) rows for {missing}"


def test_every_exit_code_is_documented() -> None:
    missing = [f"{code} {reason}" for code, reason in constants.EXIT_REASONS.items()
               if f"| {code} | {reason} |" not in DOC]
    assert not missing, f"docs/health.md lacks exit codes {missing}"
