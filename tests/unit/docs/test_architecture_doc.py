"""docs/architecture.md is where the code's contracts are written down: every citation of it names a section that
exists, and no file of the product, its tests or its docs points at a document outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.paths import ROOT

DOC = ROOT / "docs" / "architecture.md"
TREES = ("operator", "tests", "benchmarks", "testcluster", "fakevllm", "scripts", "charts", "docs")
SOURCES = sorted({p for tree in TREES for pattern in ("*.py", "*.md", "*.sh") for p in (ROOT / tree).rglob(pattern)}
                 | {ROOT / "README.md"})
THIS = Path(__file__).resolve()
OUTSIDE = re.compile(r"[Cc]ontract \d|notes/vllm\.md|notes/testing\.md|shared/|ARCHITECTURE\.md")
CITATION = re.compile(r"architecture\.md, ([A-Za-z][A-Za-z_ -]*[A-Za-z_])")


def _flat(text: str) -> str:
    """Text with line breaks (and the comment marks that continue a sentence) folded into single spaces."""
    return re.sub(r"\s*\n\s*(#\s*)?", " ", text)


def _sections() -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^#{2,3} (.+)$", DOC.read_text(), re.MULTILINE)}


def _files() -> list[Path]:
    return [p for p in SOURCES if p.resolve() != THIS and ".egg-info" not in p.parts]


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_cites_only_sections_that_exist_and_nothing_outside_the_repository(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    outside = [m.group(0) for m in OUTSIDE.finditer(text)]
    assert not outside, f"{path.relative_to(ROOT)} points outside the repository: {outside}"
    sections = _sections()
    for match in CITATION.finditer(_flat(text)):
        cited = match.group(1)
        assert any(cited.startswith(s) for s in sections), \
            f"{path.relative_to(ROOT)} cites 'architecture.md, {cited}': no such section in {sorted(sections)}"


def test_the_citation_check_sees_citations() -> None:
    cited = [m.group(1) for p in _files() for m in CITATION.finditer(_flat(p.read_text(encoding="utf-8")))]
    assert len(cited) >= 27
