"""The documentation stands alone and points at real things: the specification is in docs/, the
README links it, and every file and registry the newcomer guide names exists."""

import re
from pathlib import Path

from gmc import asynchrony, data, estimators

REPO = Path(__file__).resolve().parents[1]
PATH_RE = re.compile(r"`([\w./<>-]+/[\w.<>-]+|[\w-]+\.(?:md|yaml|py|smk))`")


def test_every_file_the_newcomer_guide_names_exists():
    text = (REPO / "docs" / "extending.md").read_text()
    paths = {p for p in PATH_RE.findall(text) if "<" not in p}
    assert len(paths) >= 12, paths
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"docs/extending.md names files that do not exist: {missing}"
    for number, task in enumerate(("A new estimator", "A new delay model", "A new benchmark", "A new cluster"), 1):
        assert f"\n## {number}. {task}\n" in text
    # the registries it names are the real ones
    assert "REGISTRY" in text and hasattr(estimators, "REGISTRY")
    assert "DELAY_MODES" in text and hasattr(asynchrony, "DELAY_MODES")
    assert "BENCHMARKS" in text and hasattr(data, "BENCHMARKS")


def test_the_specification_lives_in_the_repository_with_its_provenance():
    method = (REPO / "docs" / "method.md").read_text()
    assert "arXiv [2610.01896]" in method and "arXiv [2508.02833]" in method
    for section in range(1, 8):
        assert f"\n## {section}. " in method
    readme = (REPO / "README.md").read_text()
    first_paragraph = readme.split("\n## ")[0]
    assert "](docs/method.md)" in first_paragraph and "../shared" not in first_paragraph
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        assert "shared/docs" not in doc.read_text(), doc
