"""Cost of asynchrony: steady-state step time at fixed delay 0, 16 and 128 and under the latency
model, with synchronous training as the reference, all in one process, each with the behaviour
log-probs recomputed by the trainer (the default) and taken from the sampler; and the queue's
memory at delay 128 next to the model's parameter bytes.

The settings run interleaved: in each round every trainer takes a few steps, in a rotating
order, so all of them see the same machine (load, clock speed) and the same stage of training.
Ratios are paired within a round and summarised by their median over rounds, with the
range of the middle half. Run: python bench/asynchrony.py [MODEL_DIR] [ROUNDS] [STEPS_PER_ROUND]
"""

import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from gmc.run.config import load_train_config  # noqa: E402
from gmc.run.trainer import Trainer  # noqa: E402

LATENCY = ["delay.mode=latency", "delay.slots=48", "delay.alpha=1.0", "delay.beta=0.5"]  # the default sweep's
SETTINGS = {
    "sync": ["delay.mode=sync"],
    "fixed_d0": ["delay.mode=fixed", "delay.d=0"],
    "fixed_d16": ["delay.mode=fixed", "delay.d=16"],
    "fixed_d128": ["delay.mode=fixed", "delay.d=128"],
    "latency": LATENCY,
    # the same without the behaviour pass: the rollout engine's own log-probs
    "fixed_d16_sampler": ["delay.mode=fixed", "delay.d=16", "behaviour_logprobs=sampler"],
    "fixed_d128_sampler": ["delay.mode=fixed", "delay.d=128", "behaviour_logprobs=sampler"],
    "latency_sampler": [*LATENCY, "behaviour_logprobs=sampler"],
}
REFERENCE = "sync"


def quartiles(xs: list[float]) -> list[float]:
    q = statistics.quantiles(xs, n=4)
    return [q[0], q[2]]


def main() -> None:
    model_dir = sys.argv[1] if len(sys.argv) > 1 else "results/models/tiny/seed~0"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    per_round = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    steps = 1 + rounds * per_round
    names = list(SETTINGS)
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {}
        for name, sets in SETTINGS.items():
            cfg = load_train_config(
                None,
                [f"model={model_dir}", "device=cpu", f"steps={steps}", "checkpoint_every=0", "algorithm=gmc", *sets],
            )
            trainers[name] = Trainer(cfg, Path(tmp) / name, progress=False)
        parameter_bytes = json.loads((Path(tmp) / REFERENCE / "run.json").read_text())["parameter_bytes"]
        rows: dict[str, list[list[dict]]] = {name: [] for name in names}
        for r in range(-1, rounds):  # round -1: one warm-up step each (it carries the queue's prefill)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                trainer, block = trainers[name], []
                for _ in range(1 if r < 0 else per_round):
                    block.append(trainer.train_step().metrics)
                    trainer.step += 1
                if r >= 0:
                    rows[name].append(block)
        for trainer in trainers.values():
            trainer.close()

    def median_of(name: str, key: str, r: int | None = None) -> float:
        blocks = rows[name] if r is None else [rows[name][r]]
        return statistics.median(m.get(key, 0.0) for block in blocks for m in block)

    out: dict = {
        "rounds": rounds,
        "steps_per_round": per_round,
        "reference": REFERENCE,
        "parameter_bytes": parameter_bytes,
        "settings": {},
    }
    for name in names:
        ratios = [
            median_of(name, "time/step_seconds", r) / median_of(REFERENCE, "time/step_seconds", r)
            for r in range(rounds)
        ]
        flat = [m for block in rows[name] for m in block]
        out["settings"][name] = {
            "step_seconds_median": median_of(name, "time/step_seconds"),
            "rollout_seconds_median": median_of(name, "time/rollout_seconds"),
            "behaviour_seconds_median": median_of(name, "time/behaviour_seconds"),
            "update_seconds_median": median_of(name, "time/update_seconds"),
            "generate_calls_mean": statistics.mean(m.get("rollout/generate_calls", 0.0) for m in flat),
            "ratio_to_reference_median": statistics.median(ratios),
            "ratio_to_reference_iqr": quartiles(ratios),
            "queue_bytes_max": max(m["async/queue_bytes"] for m in flat),
            "queue_groups_max": max(m["async/queue_groups"] for m in flat),
            "staleness_mean": statistics.mean(m["async/staleness_mean"] for m in flat),
        }
    out["queue_bytes_d128_over_parameter_bytes"] = out["settings"]["fixed_d128"]["queue_bytes_max"] / parameter_bytes
    write_result("asynchrony", out)


if __name__ == "__main__":
    main()
