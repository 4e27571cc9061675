"""Cost of asynchrony: steady-state step time at delay 0, 16 and 128 and under the latency
model, against synchronous training in the same run; and the queue's memory at delay 128
next to the model's parameter bytes. Run: python bench/asynchrony.py [MODEL_DIR] [STEPS]
"""

import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from gmc.config import load_train_config  # noqa: E402
from gmc.trainer import Trainer, read_jsonl  # noqa: E402

SETTINGS = {
    "sync": ["delay.mode=sync"],
    "fixed_d0": ["delay.mode=fixed", "delay.d=0"],
    "fixed_d16": ["delay.mode=fixed", "delay.d=16"],
    "fixed_d128": ["delay.mode=fixed", "delay.d=128"],
    "latency": ["delay.mode=latency", "delay.slots=16", "delay.beta=0.5"],
}


def main() -> None:
    model_dir = sys.argv[1] if len(sys.argv) > 1 else "results/models/tiny"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    out: dict = {"steps": steps, "settings": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, sets in SETTINGS.items():
            cfg = load_train_config(None, [f"model={model_dir}", "device=cpu", f"steps={steps}", "checkpoint_every=0",
                                           "algorithm=gmc", *sets])
            trainer = Trainer(cfg, Path(tmp) / name, progress=False)
            trainer.run()
            rows = read_jsonl(Path(tmp) / name / "metrics.jsonl")[1:]  # step 0 carries the prefill
            gen = [r["time/rollout_seconds"] for r in rows if "time/rollout_seconds" in r]
            out["settings"][name] = {
                "step_seconds_median": statistics.median(r["time/step_seconds"] for r in rows),
                "rollout_seconds_median": statistics.median(gen) if gen else None,
                "queue_bytes_max": max(r["async/queue_bytes"] for r in rows),
                "queue_groups_max": max(r["async/queue_groups"] for r in rows),
                "staleness_mean": statistics.mean(r["async/staleness_mean"] for r in rows),
            }
            out["parameter_bytes"] = json.loads((Path(tmp) / name / "run.json").read_text())["parameter_bytes"]
    base = out["settings"]["sync"]["step_seconds_median"]
    for s in out["settings"].values():
        s["ratio_to_sync"] = s["step_seconds_median"] / base
    out["queue_bytes_d128_over_parameter_bytes"] = out["settings"]["fixed_d128"]["queue_bytes_max"] / out["parameter_bytes"]
    write_result("asynchrony", out)


if __name__ == "__main__":
    main()
