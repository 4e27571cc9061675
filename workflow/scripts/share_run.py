"""Record that a point shares another point's run (snakemake script): both configs are checked
to train the same run (gmc.sweep.resolve.check_shared) before anything is written."""

import sys

from gmc.io import write_json
from gmc.run.config import load_train_config
from gmc.sweep.resolve import check_shared

sm = snakemake  # noqa: F821  (injected by Snakemake)
sys.stderr = open(sm.log[0], "w")
member, run = load_train_config(sm.input["cfg"]), load_train_config(sm.input["run_cfg"])
cls = check_shared(member, run)
write_json(
    sm.output[0],
    {
        "run": sm.params["run"],
        "on_policy_class": list(cls),
        "why": f"on-policy, the same settings, and {member.algorithm} and {run.algorithm} "
        f"reduce to one loss there {list(cls)}: the same run",
    },
)
