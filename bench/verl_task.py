"""The data of the verl GPU check (bench/verl_gpu.sh): gmc's problems as verl's training and
validation parquet files.

    python bench/verl_task.py OUT_DIR [N_TRAIN] [N_VAL]

The problems are MATH's training split from gmc's local data (``GMC_DATA_ROOT``,
``train/math/train.jsonl``) where it is there, else gmc's synthetic arithmetic (the CPU run's task),
so the check needs nothing downloaded. Each row is verl's format (``data_source``, a chat
``prompt`` with gmc's step-by-step instruction, ``reward_model.ground_truth``); the
``data_source`` is MATH's, which verl's default reward (``verl.utils.reward_score``) grades by the
last ``\\boxed{}`` answer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from gmc.tasks.datasets import INSTRUCTION, data_root, load_dataset
from gmc.tasks.synthetic import SyntheticTask

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
"""verl's name for MATH, whose default reward grades the last boxed answer."""


def problems(n_train: int, n_val: int):
    """The training and validation records, and which set they come from."""
    if (data_root() / "train/math/train.jsonl").exists():
        records = load_dataset("math", limit=n_train + n_val)
        return records[:n_train], records[n_train:], "MATH (GMC_DATA_ROOT)"
    task = SyntheticTask()
    return task.generate("train", n_train), task.generate("test", n_val), "synthetic arithmetic"


def verl_rows(records, split: str) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{r.problem}\n{INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": r.answer},
                "extra_info": {"split": split, "index": i, "id": r.id},
            }
            for i, r in enumerate(records)
        ]
    )


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python bench/verl_task.py OUT_DIR [N_TRAIN] [N_VAL]")
    out = Path(argv[0])
    n_train, n_val = (int(argv[1]) if len(argv) > 1 else 64), (int(argv[2]) if len(argv) > 2 else 16)
    train, val, source = problems(n_train, n_val)
    out.mkdir(parents=True, exist_ok=True)
    verl_rows(train, "train").to_parquet(out / "train.parquet")
    verl_rows(val, "test").to_parquet(out / "val.parquet")
    print(f"{len(train)} training and {len(val)} validation problems from {source} in {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
