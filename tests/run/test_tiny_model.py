"""The tiny CPU policy's warm start and its acceptance rule: judged on the validation split, a
rejected warm start replaced by one of the next replacement seed and reported, the build failing
when no attempt passes."""

import json

import pytest

from gmc.run import tiny_model
from gmc.run.tiny_model import REPLACEMENT_STRIDE, TinyModelConfig, build_tiny_model
from gmc.settings import ConfigError
from gmc.tasks.synthetic import SyntheticTask

QUICK = dict(
    max_steps=4,
    eval_every=4,
    eval_problems=8,
    batch_size=8,
    accept_problems=16,
    synthetic=SyntheticTask(validation_fraction=0.1),
)


def test_a_rejected_warm_start_is_replaced_and_reported(tmp_path, monkeypatch):
    scores = iter([0.1, 0.6])
    monkeypatch.setattr(tiny_model, "validation_accuracy", lambda *a: next(scores))
    summary = build_tiny_model(tmp_path / "m", TinyModelConfig(seed=3, accept_accuracy=0.5, **QUICK), progress=False)
    assert summary["replaced"] and summary["seed"] == 3 + REPLACEMENT_STRIDE
    assert summary["attempts"] == [
        {"seed": 3, "validation_greedy_accuracy": 0.1, "accepted": False},
        {"seed": 3 + REPLACEMENT_STRIDE, "validation_greedy_accuracy": 0.6, "accepted": True},
    ]
    assert json.loads((tmp_path / "m" / "build_summary.json").read_text())["replaced"]


def test_the_rule_is_judged_for_real_on_the_validation_split_and_fails_the_build_when_no_attempt_passes(tmp_path):
    cfg = TinyModelConfig(seed=0, accept_accuracy=0.0, **QUICK)
    summary = build_tiny_model(tmp_path / "ok", cfg, progress=False)
    assert summary["attempts"][0]["accepted"] and not summary["replaced"] and summary["seed"] == 0
    with pytest.raises(RuntimeError, match=r"no warm start of seed 0 met the acceptance rule .* in 2 attempts"):
        build_tiny_model(
            tmp_path / "no", TinyModelConfig(seed=0, accept_accuracy=1.0, max_attempts=2, **QUICK), progress=False
        )
    assert not (tmp_path / "no").exists()
    with pytest.raises(ConfigError, match="accept_accuracy: the acceptance rule judges a warm start on the validation"):
        TinyModelConfig(accept_accuracy=0.3)
