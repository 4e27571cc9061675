"""A bundle's time per stage, read from Snakemake's logs of the sweep's run."""

import json

import pytest
from helpers import sweep

from gmc.cli import main
from gmc.results.bundles import STAGES, publish
from gmc.run.provenance import PROVENANCE

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
    main(
        [
            "publish",
            "--results",
            str(sweep(tmp_path / "results")),
            "--out",
            str(out),
            "--log",
            str(first),
            "--log",
            str(second),
        ]
    )
    stages = json.loads((out / PROVENANCE).read_text())["stages"]
    assert stages["wall_seconds"] == [182.0, 122.0]
    assert stages["rules"] == {
        "train": {"jobs": 4, "seconds": 121 + 180 + 121 + 60, "longest": 180},
        "train_config": {"jobs": 2, "seconds": 2, "longest": 1},
    }
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
