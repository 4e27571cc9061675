"""Training numerics at paper scale, on the tiny model: behaviour log-probs with the training
forward's numerics, float32 master weights under bfloat16, micro-batched runs, the KL
reference, temperature (method.md section 7)."""

import pytest
import torch

from gmc.io import read_jsonl
from gmc.run.config import ConfigError, load_train_config
from gmc.run.summary import without_time
from gmc.run.trainer import Trainer
from gmc.tasks.grading import Grade

FROZEN = 1e-30  # an Adam step of this size leaves every float32 weight unchanged


LATENCY = {"delay.mode": "latency", "delay.slots": 6, "delay.beta": 0.1}


FIXED = {"delay.mode": "fixed", "delay.d": 2}


@pytest.mark.parametrize(
    "dtype,delay,checkpointing,budget,tol",
    [
        ("float32", FIXED, False, 0, 1e-5),
        ("float32", LATENCY, True, 64, 1e-5),
        ("bfloat16", FIXED, True, 64, 1e-3),
        ("bfloat16", LATENCY, True, 0, 1e-3),
        ("bfloat16", FIXED, False, 0, 1e-3),
    ],
    ids=["f32-fixed", "f32-latency-ckpt-mb", "bf16-fixed-ckpt-mb", "bf16-latency-ckpt", "bf16-fixed"],
)
def test_fixed_weights_give_zero_log_ratios(tmp_path, train_small, dtype, delay, checkpointing, budget, tol):
    """With weights that never change, every trained trajectory log-ratio is 0 and no cap fires:
    the behaviour pass has the training forward's numerics whatever the batch and padding."""
    metrics = train_small(
        tmp_path / "frozen",
        algorithm="gmc",
        lr=FROZEN,
        model_dtype=dtype,
        gradient_checkpointing=checkpointing,
        micro_batch_tokens=budget,
        **delay,
    )
    assert any(r["async/staleness_max"] > 0 for r in metrics)
    for r in metrics:
        assert max(abs(r["ratio/log_ratio_max"]), abs(r["ratio/log_ratio_min"])) <= tol, r
        assert r["ratio/frac_groups_capped"] == 0


class HalfRight:
    """A grader that marks every other answer of a group right whatever it says, so that every
    step has a gradient: the warm-started policy of the test session answers about 5% right, and
    whether any of a step's answers is right depends on the rounding of the machine it samples on
    (with ``MKL_CBWR=COMPATIBLE`` no answer of a 4-step run was)."""

    def grade_batch(self, texts, golds):
        return [Grade(i % 2 == 0, float(i % 2 == 0), None, "ok" if i % 2 == 0 else "wrong") for i in range(len(texts))]

    def close(self):
        pass


def train_half_right(out, small_config, **overrides):
    """A small run whose answers :class:`HalfRight` grades; returns its metrics lines."""
    trainer = Trainer(small_config(**overrides), out, progress=False)
    trainer.collector.close()
    trainer.collector.grader = HalfRight()
    trainer.run()
    return read_jsonl(out / "metrics.jsonl")


def mean_weight_change(out, small_config, tiny_model_dir, **overrides):
    from gmc.policy.model import load_policy

    train_half_right(out, small_config, steps=4, lr=1e-6, checkpoint_every=4, **overrides)
    final = torch.load(out / "checkpoint.pt", weights_only=False)["model"]
    start, _ = load_policy(str(tiny_model_dir), "float32", "cpu")
    deltas = [(final[k].float() - v.to(final[k].dtype).float()).abs().mean() for k, v in start.state_dict().items()]
    return float(torch.stack(deltas).mean())


def test_bfloat16_at_small_lr_moves_the_weights_like_float32(tmp_path, small_config, tiny_model_dir):
    f32 = mean_weight_change(tmp_path / "f32", small_config, tiny_model_dir)
    bf16 = mean_weight_change(tmp_path / "bf16", small_config, tiny_model_dir, model_dtype="bfloat16")
    rounded = mean_weight_change(
        tmp_path / "bf16_inplace", small_config, tiny_model_dir, model_dtype="bfloat16", master_weights=False
    )
    assert 0.5 < bf16 / f32 < 2, (f32, bf16)
    assert rounded < 0.2 * f32, (f32, rounded)  # without masters, most updates round away


def test_micro_batched_run_matches_the_whole_batch_run(tmp_path, train_small):
    whole = train_small(tmp_path / "whole", algorithm="gmc", **FIXED)
    micro = train_small(tmp_path / "micro", algorithm="gmc", micro_batch_tokens=64, **FIXED)
    assert len(whole) == len(micro) == 3
    for a, b in zip(without_time(whole), without_time(micro)):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), key  # 1e-5: float32 rounding


def test_kl_to_a_frozen_reference(tmp_path, tiny_model_dir, small_config):
    cfg = load_train_config(None, [f"model={tiny_model_dir}", "device=cpu", "estimator.kl_coef=0.1"])
    trainer = Trainer(cfg, tmp_path / "kl_setup", progress=False)
    ref = trainer.update.reference
    assert ref is not None and ref is not trainer.model and not any(p.requires_grad for p in ref.parameters())
    trainer.close()
    plain = Trainer(
        load_train_config(None, [f"model={tiny_model_dir}", "device=cpu"]), tmp_path / "plain", progress=False
    )
    assert plain.update.reference is None
    plain.close()
    metrics = train_half_right(
        tmp_path / "kl", small_config, lr=1e-3, micro_batch_tokens=64, **{"estimator.kl_coef": 0.1}
    )
    assert metrics[0]["loss/kl"] == 0  # the reference is the starting policy
    assert metrics[-1]["loss/kl"] > 0
    for r in metrics:
        assert r["loss/total"] == pytest.approx(r["loss/pg"] + 0.1 * r["loss/kl"], rel=1e-5, abs=1e-7)


def test_log_probs_are_those_of_the_sampled_temperature(tmp_path, train_small):
    """At temperature 0.7 the trainer's behaviour log-probs equal the sampler's (which are of
    softmax(logits / 0.7)); top_p < 1 is refused for training."""
    metrics = train_small(tmp_path / "t07", steps=2, **{"delay.d": 2, "sampling.temperature": 0.7})
    assert all(r["rollout/logp_mismatch_max"] < 1e-4 for r in metrics)
    with pytest.raises(ConfigError, match="sampling.top_p"):
        load_train_config(None, ["sampling.top_p=0.9"])
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        load_train_config(None, ["micro_batch_tokens=-1"])
