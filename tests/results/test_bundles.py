"""Published bundles: what they keep, that they redraw the tables and figures alone, their
archive, and every bundle in the repository against itself and the tables the code draws."""

import json
from pathlib import Path

import pytest
from helpers import REPO, sweep

from gmc.cli import main
from gmc.results.compare import compare
from gmc.run.provenance import PROVENANCE


def test_a_bundle_keeps_what_tables_and_figures_read_and_no_weights(bundle, tmp_path):
    run = bundle / "train" / "algo~gmc" / "delay~16" / "group~8" / "seed~1"
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "metrics.jsonl", "run.json", "summary.json"]
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0]) == {"step": 0, "rollout/reward_mean": 0.64}
    assert not list(bundle.glob("**/*.pt")) and not list(bundle.glob("**/*completions*"))
    assert (bundle / "eval" / "base" / "seed~2" / "synthetic.json").exists()
    assert (bundle / "configs" / "eval.yaml").exists() and not (bundle / "configs" / "train").exists()
    provenance = json.loads((bundle / PROVENANCE).read_text())
    assert provenance["commit"] == "abc123" and provenance["machine"]["cores"] >= 1
    assert provenance["threads"] == {"train": [1], "build": "not recorded"}
    # the tables, and the figures drawn from the bundle alone
    assert (bundle / "tables" / "main.csv").exists() and (bundle / "tables" / "paired.md").exists()
    main(["report", "--results", str(bundle)])
    assert (bundle / "figures" / "score_vs_delay.png").stat().st_size > 5000
    assert (bundle / "figures" / "reward_vs_step.png").exists()


def test_a_bundle_counts_the_groups_its_stale_runs_trained_again(tmp_path):
    """``stale_groups`` in the provenance sums the stale runs' ``summary.json`` counts (delay 16
    here; the on-policy runs are not counted) and names the runs that predate the count."""
    from gmc.results.bundles import publish

    results = sweep(tmp_path / "results")
    stale = sorted((results / "train").glob("*/delay~16/*/seed~*/summary.json"))
    for i, path in enumerate(stale[1:]):  # the first records no count
        path.write_text(json.dumps({**json.loads(path.read_text()), "async/groups": 24, "async/groups_reused": i}))
    publish(results, tmp_path / "bundle")
    provenance = json.loads((tmp_path / "bundle" / PROVENANCE).read_text())
    assert provenance["stale_groups"] == {"runs": 6, "groups": 5 * 24, "reused": 0 + 1 + 2 + 3 + 4, "not_recorded": 1}


def test_an_exported_archive_is_the_bundle_and_imports_back(bundle, tmp_path):
    import tarfile

    from gmc.results.bundles import export_results, import_results

    archive = tmp_path / "results.tar.gz"
    count = export_results(tmp_path / "results", archive)
    assert import_results(archive, tmp_path / "elsewhere") == count
    files = {p.relative_to(bundle) for p in bundle.rglob("*") if p.is_file() and p.parent.name != "figures"}
    assert {p.relative_to(tmp_path / "elsewhere") for p in (tmp_path / "elsewhere").rglob("*") if p.is_file()} == files
    for path in files - {Path(PROVENANCE)}:  # its date is the export's
        assert (tmp_path / "elsewhere" / path).read_bytes() == (bundle / path).read_bytes(), path
    # a folder unpacked from a bundle exports again with its time per stage, and takes no second import
    stages = json.loads((REPO / "published" / "default" / PROVENANCE).read_text())["stages"]
    provenance = json.loads((tmp_path / "elsewhere" / PROVENANCE).read_text())
    (tmp_path / "elsewhere" / PROVENANCE).write_text(json.dumps({**provenance, "stages": stages}))
    export_results(tmp_path / "elsewhere", tmp_path / "again.tar.gz")
    with tarfile.open(tmp_path / "again.tar.gz") as tar:
        assert tar.extractfile("stages.md").read().decode() == (REPO / "published/default/stages.md").read_text()
    with pytest.raises(FileExistsError, match="elsewhere: not empty"):
        import_results(archive, tmp_path / "elsewhere")
    unsafe = tmp_path / "unsafe.tar.gz"
    with tarfile.open(unsafe, "w:gz") as tar:
        tar.add(archive, arcname="../outside.tar.gz")
    with pytest.raises(ValueError, match=r"unsafe.tar.gz: unsafe member path '../outside.tar.gz'"):
        import_results(unsafe, tmp_path / "again")


PUBLISHED = sorted(p.parent for p in (REPO / "published").glob(f"*/{PROVENANCE}"))


@pytest.mark.parametrize("published", PUBLISHED, ids=lambda p: p.name)
def test_every_published_bundle_agrees_with_itself_and_its_tables_are_the_codes(published, tmp_path):
    """A bundle of the repository read as the results side of the comparison: every estimate
    inside its own interval, every conclusion held; its stale runs trained no group twice; and
    its tables are what the code draws from it today (a bundle whose tables went stale fails
    here, not in a reader's hands)."""
    from gmc.results.tables import write_tables

    stale = json.loads((published / PROVENANCE).read_text()).get("stale_groups")
    if stale is not None:  # a bundle published since the count: no stale run trained a group twice
        assert stale["reused"] == 0 and stale["not_recorded"] == 0, stale
    comparison = compare(published, published)
    assert all(c.outcome == "held" for c in comparison.conclusions)
    assert all(c.inside is not False for c in comparison.checks)
    write_tables(published, tmp_path)
    for table in sorted(tmp_path.glob("*.md")):
        assert table.read_text() == (published / "tables" / table.name).read_text(), table.name
