"""The documentation stands alone and points at real things: the specification is in docs/, the
README links it, and every file and registry the newcomer guide names exists."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATH_RE = re.compile(r"`([\w./<>-]+/[\w.<>-]+|[\w-]+\.(?:md|yaml|py|smk))`")


TASKS = {"A new estimator": ("REGISTRY",), "A new delay mode": ("DELAY_MODES",),
         "A new benchmark": ("BENCHMARKS",), "A new rollout engine": ("ENGINES",),
         "A new figure or table": ("FIGURES", "TABLES"), "A new cluster": ()}
"""Each task of docs/extending.md and the registries it extends."""


def test_every_task_of_the_newcomer_guide_lists_files_that_hold_its_registry():
    text = (REPO / "docs" / "extending.md").read_text()
    paths = {p for p in PATH_RE.findall(text) if "<" not in p}
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"docs/extending.md names files that do not exist: {missing}"
    sections = re.split(r"\n## \d+\. ", text)[1:]
    assert [s.split("\n", 1)[0] for s in sections] == list(TASKS)
    for section, (task, registries) in zip(sections, TASKS.items()):
        files = re.findall(r"`([^`]+)`", section.split("**Files:**", 1)[1])
        assert files and all((REPO / f).exists() for f in files), (task, files)
        for name in registries:  # the registry the task extends is defined in a file it lists
            defined = [f for f in files if f.endswith(".py")
                       and re.search(rf"^{name}(: [^=]+)? = ", (REPO / f).read_text(), re.M)]
            assert defined, f"{task}: {name} is defined in none of {files}"
            assert f"`{name}`" in section


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


BUNDLES = ("default", "corrections", "corrections_long", "real_async")
"""The published bundles: one per preset, each quoted by the README."""


def test_every_number_the_readme_quotes_from_a_bundle_is_the_bundles():
    """The README's tables are the bundles' files verbatim, and every number of its prose about a
    bundle is printed in that bundle (``gmc quote-bundles --check``): none is copied by hand."""
    from gmc.quotes import quoted_bundles, stale_includes, unquoted

    readme = REPO / "README.md"
    quoted = quoted_bundles(readme)
    assert {f"published/{b}" for b in BUNDLES} <= set(quoted["numbers"])
    for table in ("default/tables/main.md", "corrections/tables/league.md", "corrections_long/tables/league.md"):
        assert f"published/{table}" in quoted["include"]
    assert stale_includes(readme) == []
    assert unquoted(readme) == []
