"""Real asynchrony against the synchronous loop, each on devices of its own: the trainer pinned
to one core, each Ray rollout worker to another (``os.sched_setaffinity`` on every thread of
its process: a stand-in for separate GPUs), the synchronous loop on the trainer's core alone. Both do the same work per
step: the same model, batch and answers, behaviour log-probs from the sampler in both (no extra
pass on either side). Decoding is slowed by ``hf.token_seconds`` (wall clock without CPU) so
that generation and the update take comparable time, where overlap pays most.

From the synchronous runs: ``t_gen`` (generation and grading) and ``t_train`` (the update) of a
step, and the ideal speed-up of a pipeline that hides the shorter of the two entirely,
``(t_gen + t_train) / max(t_gen, t_train)``; from the Ray runs (one worker, bound 1): the
achieved speed-up over the synchronous step and its fraction of the ideal. Settings alternate
over ``ROUNDS`` rounds of ``STEPS`` steps (the first two of each run dropped); medians over
rounds with their range.

    python bench/real_async.py [MODEL_DIR] [STEPS] [ROUNDS] [TOKEN_SECONDS]
"""

import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from gmc.io import read_jsonl  # noqa: E402
from gmc.run.config import load_train_config  # noqa: E402
from gmc.run.trainer import Trainer  # noqa: E402

TRAINER_CORE = 0
CORES = 2
"""The trainer's and one worker's."""
SETTINGS = {
    "sync": ["delay.mode=sync"],
    "ray_1_worker": ["delay.mode=ray", "delay.workers=1", "delay.max_staleness=1"],
}


def pin(pid: int, cores: set[int]) -> None:
    """Pin every thread of process ``pid`` and of its children: a Ray worker runs its methods in
    threads of their own, started (like the process itself) with the affinity of the process
    that started Ray, the trainer's."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cores)
        for child in Path(f"/proc/{pid}/task/{tid}/children").read_text().split():
            pin(int(child), cores)


def run(model_dir: str, steps: int, token_seconds: float, sets: list[str], out: Path) -> dict:
    """One run of a setting, the trainer on :data:`TRAINER_CORE` and each worker on a core of its own."""
    cfg = load_train_config(
        None,
        [
            f"model={model_dir}",
            "device=cpu",
            f"steps={steps}",
            "checkpoint_every=0",
            "algorithm=gmc",
            "behaviour_logprobs=sampler",
            f"hf.token_seconds={token_seconds}",
            *sets,
        ],
    )
    trainer = Trainer(cfg, out, progress=False)
    workers = getattr(trainer.source, "workers", [])
    if workers:
        import ray

        for core, worker in enumerate(workers, start=TRAINER_CORE + 1):
            pin(ray.get(worker.pid.remote()), {core})
    trainer.run()
    rows = read_jsonl(out / "metrics.jsonl")[2:]
    median = lambda key: statistics.median(r.get(key, 0.0) for r in rows)  # noqa: E731
    return {
        "step_seconds": median("time/step_seconds"),
        "update_seconds": median("time/update_seconds"),
        "generation_seconds": median("time/rollout_seconds"),
        "staleness_mean": median("async/staleness_mean"),
        "trainer_idle_seconds": median("async/trainer_idle_seconds"),
    }


def main() -> None:
    model_dir = sys.argv[1] if len(sys.argv) > 1 else "results/models/tiny/seed~0"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    token_seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 0.004
    if len(os.sched_getaffinity(0)) < CORES:
        sys.exit(f"needs {CORES} cores: the trainer's and a worker's")
    os.sched_setaffinity(0, {TRAINER_CORE})  # the trainer's device; Ray's workers are pinned apart
    import torch

    torch.set_num_threads(1)
    results: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    names = list(SETTINGS)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                results[name].append(run(model_dir, steps, token_seconds, SETTINGS[name], Path(tmp) / f"{name}{r}"))
    sync, real = results["sync"], results["ray_1_worker"]
    t_gen = statistics.median(x["generation_seconds"] for x in sync)
    t_train = statistics.median(x["update_seconds"] for x in sync)
    ideal = (t_gen + t_train) / max(t_gen, t_train)
    speedups = [s["step_seconds"] / a["step_seconds"] for s, a in zip(sync, real)]  # paired by round
    achieved = statistics.median(speedups)
    write_result(
        "real_async",
        {
            "steps": steps,
            "rounds": rounds,
            "token_seconds": token_seconds,
            "pinning": {"trainer": TRAINER_CORE, "workers": list(range(TRAINER_CORE + 1, CORES))},
            "t_gen_seconds": t_gen,
            "t_train_seconds": t_train,
            "ideal_speedup": ideal,
            "achieved_speedup": achieved,
            "achieved_speedup_range": [min(speedups), max(speedups)],
            "fraction_of_ideal": achieved / ideal,
            "fraction_of_ideal_gain": (achieved - 1) / (ideal - 1),
            "settings": results,
        },
    )


if __name__ == "__main__":
    main()
