"""Real asynchrony against the synchronous loop: steps per second and the trainer's idle fraction
for ``sync``, ``fixed`` (delay 1, in process) and ``ray`` with one and two workers, on the same
work, on CPU; with decoding slowed by ``hf.token_seconds`` (a stand-in for a model whose
generation dominates, which costs wall clock but no CPU), so that the overlap asynchrony buys
shows even on 2 cores.

The settings run one after another, in alternation over ``ROUNDS`` rounds (their workers
would run on while another trainer steps, so they cannot interleave within a round); each
setting's steady state is the median step time after its first two steps. The ideal overlap of
a setting is ``sync step / max(generation, update)``: what a pipeline that hides the shorter
of the two entirely would reach.

    python bench/real_async.py [MODEL_DIR] [STEPS] [ROUNDS] [TOKEN_SECONDS]
"""

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from gmc.config import load_train_config  # noqa: E402
from gmc.io import read_jsonl  # noqa: E402
from gmc.trainer import Trainer  # noqa: E402

SETTINGS = {
    "sync": ["delay.mode=sync"],
    "fixed_d1": ["delay.mode=fixed", "delay.d=1"],
    "ray_1_worker": ["delay.mode=ray", "delay.workers=1", "delay.max_staleness=1"],
    "ray_2_workers": ["delay.mode=ray", "delay.workers=2", "delay.max_staleness=2"],
}


def run(model_dir: str, steps: int, token_seconds: float, sets: list[str], out: Path) -> dict:
    cfg = load_train_config(None, [f"model={model_dir}", "device=cpu", f"steps={steps}", "checkpoint_every=0",
                                   "algorithm=gmc", f"hf.token_seconds={token_seconds}", *sets])
    Trainer(cfg, out, progress=False).run()
    rows = read_jsonl(out / "metrics.jsonl")[2:]
    step = statistics.median(r["time/step_seconds"] for r in rows)
    idle = [r.get("async/trainer_idle_seconds", r.get("time/rollout_seconds", 0.0)) for r in rows]
    return {"step_seconds": step, "idle_fraction": statistics.median(i / r["time/step_seconds"]
                                                                     for i, r in zip(idle, rows)),
            "update_seconds": statistics.median(r["time/update_seconds"] for r in rows),
            "rollout_seconds": statistics.median(r.get("time/rollout_seconds", 0.0) for r in rows)}


def main() -> None:
    model_dir = sys.argv[1] if len(sys.argv) > 1 else "results/models/tiny/seed~0"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    token_seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 0.01
    results: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    names = list(SETTINGS)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                results[name].append(run(model_dir, steps, token_seconds, SETTINGS[name], Path(tmp) / f"{name}{r}"))
    summary = {name: {k: statistics.median(x[k] for x in runs) for k in runs[0]} for name, runs in results.items()}
    sync = summary["sync"]
    # the synchronous step is generation then update; hiding the shorter entirely is the ideal
    generation = sync["step_seconds"] - sync["update_seconds"]
    ideal = sync["step_seconds"] / max(generation, sync["update_seconds"])
    for s in summary.values():
        s["speedup_over_sync"] = sync["step_seconds"] / s["step_seconds"]
        s["share_of_ideal_overlap"] = (s["speedup_over_sync"] - 1) / (ideal - 1) if ideal > 1 else float("nan")
    write_result("real_async", {"steps": steps, "rounds": rounds, "token_seconds": token_seconds,
                                "ideal_speedup": ideal, "settings": summary})


if __name__ == "__main__":
    main()
