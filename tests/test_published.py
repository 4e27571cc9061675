"""Published bundles: what they keep, that they redraw the tables and figures alone, and the
check of a re-run against them (every estimate, each resolved conclusion, the exit status)."""

import json
import math
from pathlib import Path

import pytest

from gmc.cli import main
from gmc.published import PROVENANCE, STAGES, Conclusion, compare, publish

SCORES = {"gmc": (0.60, 0.64, 0.62), "grpo": (0.40, 0.45, 0.41)}
"""Greedy accuracy per seed at delay 16: gmc − grpo is resolved."""


def sweep(results, scores=SCORES, base=(0.30, 0.33, 0.31)):
    """A finished sweep's results folder: two estimators at delays 0 and 16, three seeds, a base
    model per seed, each run with a checkpoint the bundle must leave out."""
    for algo, per_seed in scores.items():
        for delay in (0, 16):
            for seed, score in enumerate(per_seed):
                point = f"algo~{algo}/delay~{delay}/group~8/seed~{seed}"
                run = results / "train" / point
                run.mkdir(parents=True)
                (run / "summary.json").write_text(json.dumps({"steps": 3, "rollout/reward_mean_last20": score}))
                (run / "config.yaml").write_text(f"algorithm: {algo}\nseed: {seed}\n")
                (run / "run.json").write_text(json.dumps({"git_revision": "abc123", "seed": seed, "threads": 1}))
                (run / "metrics.jsonl").write_text("".join(json.dumps(
                    {"step": t, "rollout/reward_mean": score, "loss": 0.1, "time/step_seconds": 1.0}) + "\n"
                    for t in range(3)))
                (run / "checkpoint.pt").write_bytes(b"weights")
                ev = results / "eval" / point
                ev.mkdir(parents=True)
                s = score if delay else score + 0.05
                (ev / "synthetic.json").write_text(json.dumps({"benchmark": "synthetic", "greedy": s,
                                                               "pass_at_1": s, "pass_at_1_se": 0.01, "problems": 500}))
                (ev / "synthetic.completions.jsonl").write_text("{}\n")
    for seed, score in enumerate(base):
        ev = results / "eval" / "base" / f"seed~{seed}"
        ev.mkdir(parents=True)
        (ev / "synthetic.json").write_text(json.dumps({"benchmark": "synthetic", "greedy": score, "pass_at_1": score,
                                                       "pass_at_1_se": 0.01, "problems": 500}))
    (results / "configs" / "train").mkdir(parents=True)
    (results / "configs" / "eval.yaml").write_text("benchmarks: [synthetic]\n")
    return results


@pytest.fixture()
def bundle(tmp_path):
    out = tmp_path / "published"
    publish(sweep(tmp_path / "results"), out)
    return out


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


def test_an_exported_archive_is_the_bundle_and_imports_back(bundle, tmp_path):
    import tarfile

    from gmc.published import export_results, import_results

    archive = tmp_path / "results.tar.gz"
    count = export_results(tmp_path / "results", archive)
    assert import_results(archive, tmp_path / "elsewhere") == count
    files = {p.relative_to(bundle) for p in bundle.rglob("*") if p.is_file() and p.parent.name != "figures"}
    assert {p.relative_to(tmp_path / "elsewhere") for p in (tmp_path / "elsewhere").rglob("*") if p.is_file()} == files
    for path in files - {Path(PROVENANCE)}:  # its date is the export's
        assert (tmp_path / "elsewhere" / path).read_bytes() == (bundle / path).read_bytes(), path
    unsafe = tmp_path / "unsafe.tar.gz"
    with tarfile.open(unsafe, "w:gz") as tar:
        tar.add(archive, arcname="../outside.tar.gz")
    with pytest.raises(ValueError, match=r"unsafe.tar.gz: unsafe member path '../outside.tar.gz'"):
        import_results(unsafe, tmp_path / "again")


def test_a_re_run_of_the_same_numbers_agrees_everywhere(bundle, tmp_path, capsys):
    comparison = compare(bundle, tmp_path / "results")
    assert comparison.checks and all(c.inside is not False for c in comparison.checks)
    resolved = [c.key for c in comparison.conclusions]
    assert "gmc − grpo at delay 16, G = 8, eval/synthetic/greedy" in resolved
    assert comparison.holds
    with pytest.raises(SystemExit) as stop:
        main(["compare-results", str(bundle), str(tmp_path / "results")])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "0 of" in out and "one in twenty" in out and f"{len(resolved)} of {len(resolved)} published conclusions hold" in out
    base = next(c for c in comparison.checks if c.key == "base/-/0 eval/synthetic/greedy")
    assert base.published_half > 0  # the base row has an interval: a base model per seed


def test_a_re_run_that_reverses_a_conclusion_exits_1(bundle, tmp_path, capsys):
    other = sweep(tmp_path / "other", scores={"gmc": (0.40, 0.45, 0.41), "grpo": (0.60, 0.64, 0.62)})
    comparison = compare(bundle, other)
    reversed_ = next(c for c in comparison.conclusions if c.key == "gmc − grpo at delay 16, G = 8, eval/synthetic/greedy")
    assert reversed_.verdict == "does not hold: the sign changed" and not comparison.holds
    assert any(c.inside is False for c in comparison.checks)
    with pytest.raises(SystemExit) as stop:
        main(["compare-results", str(bundle), str(other)])
    assert stop.value.code == 1 and "does not hold" in capsys.readouterr().out


def test_an_unreadable_bundle_or_results_folder_exits_2_naming_the_file(bundle, tmp_path, capsys):
    for args, named in (([str(tmp_path / "nothing"), str(tmp_path / "results")], "nothing/provenance.json"),
                        ([str(bundle), str(tmp_path / "empty")], "empty/train")):
        (tmp_path / "empty").mkdir(exist_ok=True)
        with pytest.raises(SystemExit) as stop:
            main(["compare-results", *args])
        assert stop.value.code == 2 and named in capsys.readouterr().err
    (bundle / "tables" / "paired.csv").write_text("")
    with pytest.raises(SystemExit) as stop:
        main(["compare-results", str(bundle), str(tmp_path / "results")])
    assert stop.value.code == 2 and "paired.csv" in capsys.readouterr().err


@pytest.mark.parametrize("new,resolved,verdict", [
    ((0.10, 0.02, 0.18), True, "holds: same sign, resolved again"),
    ((0.05, -0.01, 0.11), False, "holds: same sign, not resolved, overlaps the published interval"),
    ((0.01, -0.01, 0.03), False, "does not hold: same sign but unresolved and outside the published interval"),
    ((-0.10, -0.18, -0.02), True, "does not hold: the sign changed"),
    (None, False, "not in the re-run: cannot be checked"),
    ((math.nan, math.nan, math.nan), False, "does not hold: the sign changed"),
])
def test_a_conclusion_holds_when_its_sign_stays_and_it_is_resolved_or_overlaps(new, resolved, verdict):
    c = Conclusion("gmc − grpo", (0.12, 0.06, 0.18), new, resolved)
    assert c.verdict == verdict and c.holds == verdict.startswith("holds")


SNAKEMAKE_LOG = """Building DAG of jobs...
[Fri Dec  4 13:03:12 2026]
localrule train_config:
    output: results/configs/train/algo~gmc/delay~0/group~8/seed~0.yaml
    jobid: 15
    resources: tmpdir=/tmp
[Fri Dec  4 13:03:13 2026]
Finished jobid: 15 (Rule: train_config)
[Fri Dec  4 13:03:13 2026]
rule train:
    input: results/configs/train/algo~gmc/delay~0/group~8/seed~0.yaml
    output: results/train/algo~gmc/delay~0/group~8/seed~0/summary.json
    jobid: 3
    reason: Missing output files
[Fri Dec  4 13:03:14 2026]
rule train:
    output: results/train/algo~tic/delay~0/group~8/seed~0/summary.json
    jobid: 4
[Fri Dec  4 13:05:14 2026]
Finished jobid: 3 (Rule: train)
[Fri Dec  4 13:06:14 2026]
Finished jobid: 4 (Rule: train)
"""


def test_a_bundle_records_the_time_of_each_stage_from_the_snakemake_logs(tmp_path):
    """Two invocations of one sweep (a run continued): per rule its jobs, summed and longest
    seconds over both logs; the wall time of each."""
    first, second = tmp_path / "a.snakemake.log", tmp_path / "b.snakemake.log"
    first.write_text(SNAKEMAKE_LOG)
    second.write_text(SNAKEMAKE_LOG.replace("13:06:14", "13:04:14"))
    out = tmp_path / "published"
    main(["publish", "--results", str(sweep(tmp_path / "results")), "--out", str(out),
          "--log", str(first), "--log", str(second)])
    stages = json.loads((out / PROVENANCE).read_text())["stages"]
    assert stages["wall_seconds"] == [182.0, 122.0]
    assert stages["rules"] == {"train": {"jobs": 4, "seconds": 121 + 180 + 121 + 60, "longest": 180},
                               "train_config": {"jobs": 2, "seconds": 2, "longest": 1}}
    (tmp_path / "no_jobs.log").write_text("Building DAG of jobs...\nNothing to be done.\n")
    with pytest.raises(ValueError, match="no_jobs.log: no finished job"):
        publish(tmp_path / "results", out, [tmp_path / "no_jobs.log"])
    # the same times as the bundle's Markdown table, longest stage first, redrawn by gmc report
    text = (out / STAGES).read_text()
    assert text.startswith("Wall time 5.1 min (304 s over 2 invocations), 6 jobs.")
    assert text.index("| train | 4 | 482 s | 120 s | 180 s |") < text.index("| train_config | 2 | 2 s | 1 s | 1 s |")
    (out / STAGES).unlink()
    main(["tables", "--results", str(out)])
    assert (out / STAGES).read_text() == text


DOC = """# Results

<!-- include published/tables/main.md -->
stale
<!-- end include -->

<!-- numbers from published -->
Staleness costs grpo {cost} ({sign}), {lone} alone, at temperature 0.6; gmc leads by {lead};
the sweep took {wall}.
<!-- end numbers -->
"""


def test_a_document_quotes_a_bundle_only_through_its_files(bundle, tmp_path, capsys):
    """An included block is the bundle's file, rewritten from it; a number in a marked region that
    the bundle does not print (a hand-typed or stale one) fails, naming the document's line."""
    (bundle / "configs" / "eval.yaml").write_text("temperature: 0.6\n")
    (bundle / PROVENANCE).write_text(json.dumps({"stages": {"wall_seconds": [4443.0], "rules": {
        "train": {"jobs": 2, "seconds": 10.0, "longest": 6.0}}}}))
    main(["tables", "--results", str(bundle)])
    paired = (bundle / "tables" / "paired.md").read_text()
    cost = next(line for line in paired.splitlines() if line.startswith("| grpo: stale − on-policy | 16 | 8 |"))
    cell = cost.split(" | ")[5]  # synthetic Pass@1, e.g. "-0.050 ± 0.035 (3/3) *"
    estimate, sign = cell.split(" (")[0], cell.split("(")[1].split(")")[0]
    diff, half = estimate.split(" ± ")
    ahead = next(line for line in paired.splitlines() if line.startswith("| gmc − grpo | 16 | 8 |"))
    lead = ahead.split(" | ")[5].split(" (")[0]  # a positive estimate, e.g. "+0.200 ± 0.043"
    lead_half = lead.split(" ± ")[1]
    doc = tmp_path / "README.md"
    doc.write_text(DOC.format(cost=estimate.replace("-", "−"), sign=sign, lone=diff.lstrip("-"), lead=lead,
                              wall="74.0 min"))
    with pytest.raises(SystemExit) as stop:
        main(["quote-bundles", "--check", str(doc)])
    assert stop.value.code == 1 and "README.md:3: the block differs from published/tables/main.md" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["quote-bundles", str(doc)])
    assert stop.value.code == 0
    assert (bundle / "tables" / "main.md").read_text() in doc.read_text()
    with pytest.raises(SystemExit) as stop:
        main(["quote-bundles", "--check", str(doc)])
    assert stop.value.code == 0
    # a stale duration, a sign count, and intervals that belong to other estimates (a negative and a positive one)
    other = next(c for c in (0.2, 0.3, 0.5) if f"{c:.3f}" not in half)
    doc.write_text(doc.read_text().replace("74.0 min", "73.9 min").replace(f"({sign})", "(2/5)")
                   .replace(f"± {half}", f"± {other:.3f}").replace(f"{lead}", lead.replace(lead_half, "0.999")))
    with pytest.raises(SystemExit) as stop:
        main(["quote-bundles", "--check", str(doc)])
    err = capsys.readouterr().err
    assert stop.value.code == 1
    line = next(i for i, text in enumerate(doc.read_text().splitlines(), 1) if text.startswith("Staleness"))
    assert f"README.md:{line}: 2/5 is not a number of published" in err and f"README.md:{line + 1}: 73.9 min" in err
    assert f"README.md:{line}: {diff.lstrip('+')} ± {other:.3f} is not a number of published" in err
    assert f"README.md:{line}: {lead.lstrip('+').replace(lead_half, '0.999')} is not a number" in err
    assert err.count("is not a number") == 4  # the lone difference and the temperature are the bundle's


PUBLISHED = sorted(p.parent for p in (Path(__file__).resolve().parents[1] / "published").glob(f"*/{PROVENANCE}"))


@pytest.mark.parametrize("published", PUBLISHED, ids=lambda p: p.name)
def test_every_published_bundle_agrees_with_itself_and_its_tables_are_the_codes(published, tmp_path):
    """A bundle of the repository read as the results side of the comparison: every estimate
    inside its own interval, every conclusion holding; and its tables are what the code draws
    from it today (a bundle whose tables went stale fails here, not in a reader's hands)."""
    from gmc.analysis import write_tables

    comparison = compare(published, published)
    assert comparison.holds and all(c.inside is not False for c in comparison.checks)
    write_tables(published, tmp_path)
    for table in sorted(tmp_path.glob("*.md")):
        assert table.read_text() == (published / "tables" / table.name).read_text(), table.name
