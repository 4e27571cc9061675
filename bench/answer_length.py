"""How trajectory log-ratios and capped fractions grow with the answer's length at one delay: the
short synthetic task (~22-token answers) against the long one of
``workflow/presets/corrections_long.yaml`` (chains of partial sums, 85-210 tokens), each with
the tiny policy warm started on its own format, ``tic`` and ``gmc`` at the same fixed delay and
the same steps, learning rate and group size.

Reports, per task and estimator, the means over the steps after the delay has filled (step >=
2 d) of: response length, trajectory log-ratio ``L`` (mean, min, max), the 90% quantile of the
group's log-mass, the per-token KL estimate, the capped fraction (trajectories for ``tic``,
groups for ``gmc``), ESS / G and the shortfall.

    python bench/answer_length.py SHORT_MODEL_DIR LONG_MODEL_DIR [DELAY] [STEPS]
"""

import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from gmc.io import read_jsonl  # noqa: E402
from gmc.run.config import load_train_config  # noqa: E402
from gmc.run.trainer import Trainer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LONG = yaml.safe_load((REPO / "workflow" / "presets" / "corrections_long.yaml").read_text())
TASKS = {
    "short": [],
    "long": [f"synthetic.{k}={v}" for k, v in LONG["synthetic"].items()]
    + [f"sampling.max_new_tokens={LONG['train']['sampling']['max_new_tokens']}"],
}
COLUMNS = (
    "train/response_length_mean",
    "ratio/log_ratio_mean",
    "ratio/log_ratio_min",
    "ratio/log_ratio_max",
    "ratio/log_group_mass_p90",
    "ratio/approx_kl",
    "ratio/frac_traj_capped",
    "ratio/frac_groups_capped",
    "ratio/ess_frac",
    "ratio/shortfall",
)


def run(model_dir: str, task: str, algorithm: str, delay: int, steps: int, out: Path) -> dict:
    cfg = load_train_config(
        None,
        [
            f"model={model_dir}",
            "device=cpu",
            f"steps={steps}",
            "checkpoint_every=0",
            f"algorithm={algorithm}",
            "delay.mode=fixed",
            f"delay.d={delay}",
            "behaviour_logprobs=sampler",
            *TASKS[task],
        ],
    )
    Trainer(cfg, out, progress=False).run()
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if r["step"] >= 2 * delay]
    return {c: statistics.fmean(r[c] for r in rows) for c in COLUMNS if all(c in r for r in rows)}


def main() -> None:
    models = {"short": sys.argv[1], "long": sys.argv[2]}
    delay = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 40
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for task in TASKS:
            for algorithm in ("tic", "gmc"):
                key = f"{task}/{algorithm}"
                results[key] = run(models[task], task, algorithm, delay, steps, Path(tmp) / key)
                cells = ", ".join(f"{c.split('/')[-1]} {v:.3f}" for c, v in results[key].items())
                print(f"{key:10s} {cells}", flush=True)
    for algorithm in ("tic", "gmc"):
        short, long = results[f"short/{algorithm}"], results[f"long/{algorithm}"]
        ratios = {
            c.split("/")[-1]: long[c] / short[c]
            for c in ("train/response_length_mean", "ratio/approx_kl")
            if short.get(c)
        }
        print(f"{algorithm}: long / short " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    write_result("answer_length", {"delay": delay, "steps": steps, "models": models, "runs": results})


if __name__ == "__main__":
    main()
