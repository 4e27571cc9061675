"""The off-policy corrections against the peers' own loss code on identical inputs: verl's
``core_algos`` policy losses and rollout-correction helpers (its rejection metrics, and its
decoupled and bypass modes for the two denominators of a mask), TRL's ``GRPOTrainer._compute_loss``,
AReaL's ``ppo_actor_loss_fn`` with its M2PO mask and KPop's binary-KL rejection.

``make test-peers`` installs the peers (TRL from the ``bench`` extra, verl and AReaL 1.0.4 without
their dependencies, which pin another transformers or need GPUs) and runs this file; elsewhere
each test skips where its peer does not import. AReaL 2.0.0, which the package index lacks, is
read from ``vendored/areal-2.0.0``. Both sides see the same float32 tensors; the gradients with respect to
the policy's log-probs must agree.
"""

import ast
import dataclasses
import importlib.metadata
import math
import types
import typing
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from helpers import STALE_SHAPE, stale_batch

from gmc.estimators import (
    DIVERGENCE_METRICS,
    REGISTRY,
    EstimatorConfig,
    get_estimator,
    group_advantages,
)

B, G, T = STALE_SHAPE


def ours(name, logp, logp_b, mask, adv, cfg):
    """The gradient ``[B*G, T]`` of our loss with respect to the log-probs."""
    x = logp.clone().requires_grad_(True)
    loss, stats = get_estimator(name)(x, logp_b, mask, adv, REGISTRY[name].resolved(cfg), max_new_tokens=T)
    loss.backward()
    return x.grad.reshape(-1, logp.shape[-1]), stats


def flat(logp, logp_b, mask, adv):
    """The peers' layout: rows ``[B*G, T]``, a float mask, the advantage on every token."""
    rows, T = adv.numel(), logp.shape[-1]
    return (
        logp.reshape(rows, T),
        logp_b.reshape(rows, T),
        mask.reshape(rows, T).float(),
        adv.reshape(rows, 1).expand(rows, T).contiguous(),
    )


@pytest.fixture(scope="module")
def verl():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (make test-peers)")
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo import rollout_corr_helper
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    return types.SimpleNamespace(
        core_algos=core_algos,
        corr=rollout_corr_helper,
        ActorConfig=ActorConfig,
        PolicyLossConfig=PolicyLossConfig,
        RolloutCorrectionConfig=RolloutCorrectionConfig,
    )


def verl_grad(
    verl,
    loss_mode,
    batch,
    agg,
    response_mask=None,
    old_log_prob=None,
    batch_num_tokens=None,
    global_batch_size=None,
    **actor,
):
    """The gradient of verl's policy loss ``loss_mode``; ``response_mask`` and ``old_log_prob``
    replace the batch's; ``batch_num_tokens`` and ``global_batch_size`` are the global token and
    response counts a verl worker passes (``workers/utils/losses.py``: the loss mask's tokens,
    ``ppo_mini_batch_size * rollout.n``)."""
    logp, logp_b, mask, adv = flat(*batch)
    x = logp.clone().requires_grad_(True)
    config = verl.ActorConfig(strategy="fsdp", rollout_n=G, ppo_micro_batch_size_per_gpu=1, **actor)
    if batch_num_tokens is not None:
        config.global_batch_info["batch_num_tokens"] = batch_num_tokens
    if global_batch_size is not None:
        config.global_batch_info["global_batch_size"] = global_batch_size
    loss, _ = verl.core_algos.get_policy_loss_fn(loss_mode)(
        old_log_prob=logp_b if old_log_prob is None else old_log_prob,
        log_prob=x,
        advantages=adv,
        response_mask=mask if response_mask is None else response_mask,
        loss_agg_mode=agg,
        config=config,
    )
    loss.backward()
    return x.grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cispo_equals_verl(verl, seed):
    batch = stale_batch(seed)
    cfg = EstimatorConfig(cispo_eps_low=0.3, cispo_eps_high=0.2)
    grad, stats = ours("cispo", *batch, cfg)
    assert 0 < stats["ratio/frac_tokens_clipped"] < 1
    ref = verl_grad(verl, "cispo", batch, "token-mean", clip_ratio_low=0.3, clip_ratio_high=0.2)
    torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7)
    # the defaults: verl's CISPO recipe
    ref = verl_grad(verl, "cispo", batch, "token-mean", clip_ratio_low=10.0, clip_ratio_high=0.2)
    torch.testing.assert_close(ours("cispo", *batch, EstimatorConfig())[0], ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gmpo_equals_verl_geo_mean(verl, seed):
    batch = stale_batch(seed)
    grad, stats = ours("gmpo", *batch, EstimatorConfig())
    assert 0 < stats["ratio/frac_tokens_clipped"] < 1
    ref = verl_grad(verl, "geo_mean", batch, "seq-mean-token-mean", clip_ratio_low=0.4, clip_ratio_high=0.4)
    torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sapo_equals_verl(verl, seed):
    batch = stale_batch(seed)
    grad, stats = ours("sapo", *batch, EstimatorConfig(sapo_tau_pos=4.0, sapo_tau_neg=5.0))
    assert 0 < stats["ratio/frac_tokens_damped"] < 1
    # verl takes the mean per sequence whatever loss_agg_mode says
    ref = verl_grad(verl, "sapo", batch, "token-mean", tau_pos=4.0, tau_neg=5.0)
    torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7)
    # the defaults: verl's tau_pos and tau_neg
    ref = verl_grad(verl, "sapo", batch, "seq-mean-token-mean")
    torch.testing.assert_close(ours("sapo", *batch, EstimatorConfig())[0], ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dppo_equals_verl_dppo_tv(verl, seed):
    batch = stale_batch(seed)
    cfg = EstimatorConfig(dppo_delta_low=0.05, dppo_delta_high=0.05, dppo_ratio_cap=1.5)
    grad, stats = ours("dppo", *batch, cfg)
    assert 0 < stats["ratio/frac_tokens_masked"] < 1
    ref = verl_grad(verl, "dppo_tv", batch, "token-mean", clip_ratio_low=0.05, clip_ratio_high=0.05, clip_ratio_c=1.5)
    torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dppo_kl_equals_verl_dppo_kl(verl, seed):
    batch = stale_batch(seed)
    cfg = EstimatorConfig(dppo_kl_low=0.02, dppo_kl_high=0.03, dppo_ratio_cap=1.5)
    grad, stats = ours("dppo_kl", *batch, cfg)
    assert 0 < stats["ratio/frac_tokens_masked"] < 1
    ref = verl_grad(verl, "dppo_kl", batch, "token-mean", clip_ratio_low=0.02, clip_ratio_high=0.03, clip_ratio_c=1.5)
    torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7)
    # the defaults: the binary KL bound of verl's DPPO example (0.05) and gmc's cap of 20 (verl's
    # ActorConfig sets clip_ratio_c = 3.0, the example 1e4)
    ref = verl_grad(verl, "dppo_kl", batch, "token-mean", clip_ratio_low=0.05, clip_ratio_high=0.05, clip_ratio_c=20.0)
    torch.testing.assert_close(ours("dppo_kl", *batch, EstimatorConfig())[0], ref, rtol=1e-5, atol=1e-7)


def assert_weights_equal(name, batch, cfg, weights):
    """Our per-token weight on ``A grad log pi`` (the gradient of the ``token_mean`` loss with unit
    advantages, times the token count) equals the peer's ``weights [B*G, T]`` on valid tokens; the
    estimator's own mask statistic shows that the bounds dropped part of the batch, not all."""
    logp, logp_b, mask, _ = batch
    grad, stats = ours(name, logp, logp_b, mask, torch.ones(B, G), cfg)
    (key,) = REGISTRY[name].diagnostics
    assert 0 < stats[key] < 1, (key, stats[key])
    valid = mask.reshape(B * G, T).float()
    torch.testing.assert_close(-grad * valid.sum(), weights * valid, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_icepop_weights_equal_verl_token_is_with_a_band(verl, seed):
    batch = stale_batch(seed, scale=0.8)
    logp, logp_b, mask, _ = flat(*batch)
    weights, _ = verl.corr.compute_rollout_correction_weights(
        log_ratio=logp - logp_b, response_mask=mask, rollout_is="token", rollout_is_threshold="0.5_5.0"
    )
    assert_weights_equal("icepop", batch, EstimatorConfig(), weights)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seq_mask_weights_equal_verl_sequence_is_with_a_band(verl, seed):
    batch = stale_batch(seed, scale=0.3)
    logp, logp_b, mask, _ = flat(*batch)
    weights, _ = verl.corr.compute_rollout_correction_weights(
        log_ratio=logp - logp_b, response_mask=mask, rollout_is="sequence", rollout_is_threshold="0.5_3.0"
    )
    assert_weights_equal("seq_mask", batch, EstimatorConfig(seq_mask_low=0.5), weights)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seq_mask_geo_mean_equals_verl_seq_mean_k1_rejection(verl, seed):
    batch = stale_batch(seed, scale=0.3)
    logp, logp_b, mask, _ = flat(*batch)
    kept, _ = verl.corr.compute_rollout_rejection_mask(
        log_ratio=logp - logp_b, response_mask=mask, rollout_rs="seq_mean_k1", rollout_rs_threshold="0.9_1.1"
    )
    # verl bounds exp(mean_t -log r), the reciprocal of our geometric mean
    cfg = EstimatorConfig(seq_mask_metric="geo_mean", seq_mask_low=1 / 1.1, seq_mask_high=1 / 0.9)
    assert_weights_equal("seq_mask", batch, cfg, kept.float())


DIVERGENCE_BOUNDS = {
    "token_k1": (0.7, 1.4),
    "token_k2": (0, 0.1),
    "token_k3": (0, 0.1),
    "seq_sum_k1": (0.5, 2.0),
    "seq_sum_k2": (0, 0.3),
    "seq_sum_k3": (0, 0.3),
    "seq_mean_k1": (0.9, 1.1),
    "seq_mean_k2": (0, 0.04),
    "seq_mean_k3": (0, 0.04),
    "seq_max_k2": (0, 0.12),
    "seq_max_k3": (0, 0.12),
}
"""``(seq_mask_low, seq_mask_high)`` per rejection metric, dropping part of :func:`stale_batch` (0.3)."""


def verl_threshold(metric):
    """verl's ``rollout_rs_threshold`` for our bounds: ``"low_high"`` for k1, the upper bound otherwise."""
    low, high = DIVERGENCE_BOUNDS[metric]
    return f"{low}_{high}" if metric.endswith("k1") else str(high)


@pytest.mark.parametrize("metric", DIVERGENCE_METRICS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seq_mask_divergence_metrics_equal_verl_rejection(verl, metric, seed):
    batch = stale_batch(seed, scale=0.3)
    logp, logp_b, mask, _ = flat(*batch)
    kept, _ = verl.corr.compute_rollout_rejection_mask(
        log_ratio=logp - logp_b, response_mask=mask, rollout_rs=metric, rollout_rs_threshold=verl_threshold(metric)
    )
    low, high = DIVERGENCE_BOUNDS[metric]
    assert_weights_equal(
        "seq_mask", batch, EstimatorConfig(seq_mask_metric=metric, seq_mask_low=low, seq_mask_high=high), kept.float()
    )


VERL_AGG = {"token_mean": "token-mean", "seq_mean": "seq-mean-token-mean"}


def rejection(metric):
    """Our ``seq_mask`` settings and verl's ``(rollout_rs, rollout_rs_threshold)`` for one rejection:
    ``geo_mean`` is verl's ``seq_mean_k1``, whose bounds are on the reciprocal of the geometric mean."""
    if metric == "geo_mean":
        return EstimatorConfig(seq_mask_metric="geo_mean", seq_mask_low=1 / 1.1, seq_mask_high=1 / 0.9), (
            "seq_mean_k1",
            "0.9_1.1",
        )
    low, high = DIVERGENCE_BOUNDS[metric]
    cfg = EstimatorConfig(seq_mask_metric=metric, seq_mask_low=low, seq_mask_high=high)
    return cfg, (metric, verl_threshold(metric))


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
@pytest.mark.parametrize("metric", ["geo_mean", "seq_mean_k1", "token_k2", "seq_max_k3"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_two_denominators_are_verls_bypass_and_decoupled_rejection(verl, metric, seed, agg):
    """verl's two modes with the global counts its workers pass: ``batch_num_tokens``, the loss
    mask's tokens (every valid one in bypass mode, which rejects inside the loss; the kept ones in
    decoupled mode, which shrinks ``response_mask`` before a PPO loss whose proximal policy, one
    update per batch, is the current one), and ``global_batch_size``, every response. Under
    ``token_mean`` ``all`` is the bypass mode and ``kept`` the decoupled one; under ``seq_mean``
    both modes divide each response by its kept tokens and the batch by every response: ``kept``,
    which a rejection of whole responses makes equal to ``all``."""
    batch = stale_batch(seed, scale=0.3)
    logp, logp_b, mask, _ = flat(*batch)
    cfg, (rs, threshold) = rejection(metric)
    cfg = dataclasses.replace(cfg, aggregation=agg)
    rc = verl.RolloutCorrectionConfig(
        rollout_is=None, rollout_rs=rs, rollout_rs_threshold=threshold, loss_type="reinforce", bypass_mode=True
    )
    policy_loss = verl.PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=rc)
    counts = {"global_batch_size": B * G}
    bypass = verl_grad(
        verl, "bypass_mode", batch, VERL_AGG[agg], batch_num_tokens=mask.sum(), policy_loss=policy_loss, **counts
    )
    kept, _ = verl.corr.compute_rollout_rejection_mask(
        log_ratio=logp - logp_b, response_mask=mask, rollout_rs=rs, rollout_rs_threshold=threshold
    )
    decoupled = verl_grad(
        verl,
        "vanilla",
        batch,
        VERL_AGG[agg],
        response_mask=kept,
        old_log_prob=logp.detach(),
        batch_num_tokens=kept.sum(),
        **counts,
    )
    grad_all, stats = ours("seq_mask", *batch, cfg)
    assert 0 < stats["ratio/frac_tokens_masked"] < 1
    grad_kept, _ = ours("seq_mask", *batch, dataclasses.replace(cfg, mask_denominator="kept"))
    torch.testing.assert_close(grad_kept, decoupled, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad_all if agg == "token_mean" else grad_kept, bypass, rtol=1e-5, atol=1e-7)
    whole_responses = not metric.startswith("token_")
    assert torch.allclose(grad_kept, grad_all) == (agg == "seq_mean" and whole_responses)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
@pytest.mark.parametrize("loss_type, name", [("reinforce", "none"), ("ppo_clip", "grpo")])
def test_a_bypass_step_with_rejection_equals_verls_bypass_loss(verl, loss_type, name, agg):
    """A step of gmc's update in bypass mode (the sampler's log-probs the behaviour) with token-k1
    rejection, and token TIS for REINFORCE: the model's gradient is that of verl's
    ``compute_policy_loss_bypass_mode`` on the same log-probs with the counts verl's workers pass,
    every valid token of the batch (``batch_num_tokens``, from the unrejected loss mask) and every
    response (``global_batch_size``). Ratios stay below 3, where verl's PPO loss would cap a
    negative advantage's (``clip_ratio_c``, dual clip), which ``grpo`` does not."""
    from helpers import grads, naive_logprobs, random_groups, random_model, with_sampler

    from gmc.estimators.correction import RolloutCorrection
    from gmc.policy.logprobs import Rows
    from gmc.policy.update import Update

    model = random_model(seed=1)
    groups = with_sampler(random_groups(seed=3), seed=8, model=model)
    for grp in groups:
        grp.behaviour_logp = grp.sampler_logp
    settings = {
        "rollout_is": "token" if loss_type == "reinforce" else None,
        "rollout_is_threshold": 1.1,
        "rollout_rs": "token_k1",
        "rollout_rs_threshold": "0.8_1.25",
        "bypass_mode": True,
    }
    cfg = REGISTRY[name].resolved(EstimatorConfig(aggregation=agg))
    correction = RolloutCorrection(**settings).resolved()
    update = Update(model, get_estimator(name), cfg, 0, pad_id=0, max_new_tokens=20, correction=correction)
    update.sampler_behaviour = True
    model.zero_grad(set_to_none=True)
    _, stats, _ = update.backward(groups, on_policy=False)
    assert 0.05 < stats["rollout_corr/rollout_rs_masked_fraction"] < 0.95
    step = grads(model)

    rows = Rows.from_groups(groups)
    T = max(rows.lengths)
    sampler = torch.cat([torch.nn.functional.pad(g.sampler_logp, (0, T - g.sampler_logp.shape[1])) for g in groups])
    mask = torch.arange(T) < torch.tensor(rows.lengths).unsqueeze(-1)
    adv = group_advantages(torch.stack([g.rewards for g in groups])).reshape(-1, 1).expand_as(mask).contiguous()
    rc = verl.RolloutCorrectionConfig(**settings, loss_type=loss_type)
    config = verl.ActorConfig(
        strategy="fsdp",
        rollout_n=groups[0].response_ids.shape[0],
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=verl.PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=rc),
    )
    config.global_batch_info.update(batch_num_tokens=mask.sum(), global_batch_size=mask.shape[0])
    model.zero_grad(set_to_none=True)
    logp = torch.stack([torch.nn.functional.pad(lp, (0, T - len(lp))) for lp in naive_logprobs(model, rows)])
    loss, _ = verl.core_algos.get_policy_loss_fn("bypass_mode")(
        old_log_prob=sampler,
        log_prob=logp,
        advantages=adv,
        response_mask=mask.float(),
        loss_agg_mode=VERL_AGG[agg],
        config=config,
    )
    loss.backward()
    for ours_, theirs in zip(step, grads(model)):
        torch.testing.assert_close(ours_, theirs, rtol=1e-4, atol=1e-6)


def trl_grad(loss_type, batch, args=None, **attrs):
    """``GRPOTrainer._compute_loss`` on a stand-in trainer whose model returns ``logp``; ``args``
    adds to its ``GRPOConfig`` stand-in."""
    grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer", reason="TRL is not installed (make test-peers)")
    logp, logp_b, mask, adv = flat(*batch)
    rows, T = logp.shape
    x = logp.clone().requires_grad_(True)
    accelerator = types.SimpleNamespace(
        num_processes=1,
        sync_gradients=True,
        gather=lambda t: t,
        gather_for_metrics=lambda t: t,
        reduce=lambda t, reduction="sum": t,
    )
    settings = {"epsilon_low": 0.2, "epsilon_high": 0.2, "off_policy_mask_threshold": None, **attrs}
    trainer = types.SimpleNamespace(
        loss_type=loss_type,
        beta=0.0,
        importance_sampling_level="token",
        top_entropy_quantile=1.0,
        use_vllm=False,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1,
        accelerator=accelerator,
        model=types.SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list)},
        args=types.SimpleNamespace(
            **{"steps_per_generation": 1, "delta": None, "use_bias_correction_kl": False, **(args or {})}
        ),
        get_off_policy_mask=grpo_trainer.GRPOTrainer.get_off_policy_mask,
        _get_per_token_logps_and_entropies=lambda *a, **k: (x, torch.zeros_like(x), None),
        **settings,
    )
    inputs = {
        "prompt_ids": torch.zeros(rows, 1, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 1),
        "completion_ids": torch.zeros(rows, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv[:, 0],
        "old_per_token_logps": logp_b,
        "num_items_in_batch": mask.sum(),
    }
    grpo_trainer.GRPOTrainer._compute_loss(trainer, None, inputs).backward()
    return x.grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cispo_equals_trl(seed):
    batch = stale_batch(seed)
    cfg = EstimatorConfig(cispo_eps_high=0.3)
    grad, stats = ours("cispo", *batch, cfg)
    assert 0 < stats["ratio/frac_tokens_clipped"] < 1
    # TRL's CISPO clips from above only, at the absolute bound epsilon_high
    ref = trl_grad("cispo", batch, epsilon_high=1.3)
    torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sapo_equals_trl(seed):
    batch = stale_batch(seed)
    grad, stats = ours("sapo", *batch, EstimatorConfig(sapo_tau_pos=4.0, sapo_tau_neg=5.0))
    assert 0 < stats["ratio/frac_tokens_damped"] < 1
    ref = trl_grad("sapo", batch, args={"sapo_temperature_pos": 4.0, "sapo_temperature_neg": 5.0})
    torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7)
    # the defaults: GRPOConfig's sapo temperatures
    from trl import GRPOConfig

    defaults = {k: getattr(GRPOConfig, k) for k in ("sapo_temperature_pos", "sapo_temperature_neg")}
    assert defaults == {"sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05}
    torch.testing.assert_close(
        ours("sapo", *batch, EstimatorConfig())[0], trl_grad("sapo", batch, args=defaults), rtol=1e-5, atol=1e-7
    )


@pytest.mark.parametrize("seed", [0, 2, 3])  # batches with responses of negative advantage on both sides of the mask
def test_opsm_and_the_two_sided_clip_equal_trl(seed):
    """TRL's ``grpo`` loss with its off-policy sequence mask (the behaviour's log-probs standing in
    for the sampler's, as TRL does without vLLM) and with its two-sided clip ``delta``."""
    batch = stale_batch(seed)
    grad, stats = ours("opsm", *batch, EstimatorConfig(opsm_threshold=0.01))
    assert 0 < stats["ratio/frac_seq_masked"] < 1
    torch.testing.assert_close(grad, trl_grad("grpo", batch, off_policy_mask_threshold=0.01), rtol=1e-5, atol=1e-7)
    cfg = EstimatorConfig(grpo_delta=1.25)
    grad, stats = ours("grpo", *batch, cfg)
    assert stats["ratio/frac_tokens_clipped"] > ours("grpo", *batch, EstimatorConfig())[1]["ratio/frac_tokens_clipped"]
    torch.testing.assert_close(grad, trl_grad("grpo", batch, args={"delta": 1.25}), rtol=1e-5, atol=1e-7)
    grad, _ = ours("opsm", *batch, dataclasses.replace(cfg, opsm_threshold=0.01))
    ref = trl_grad("grpo", batch, args={"delta": 1.25}, off_policy_mask_threshold=0.01)
    torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("delta", [1.02, 1.1, 1.15, 1.2, 1.25, 1.6, 4.0])
@pytest.mark.parametrize("eps_low, eps_high", [(0.2, 0.2), (0.2, 0.28), (0.1, 0.4)])
def test_the_two_sided_clip_equals_trl_for_every_delta(delta, eps_low, eps_high):
    """``grpo_delta`` above and below ``1 + eps_high``: TRL's objective ``min(min(r, delta) A,
    clip(r) A)`` freezes positive advantages above ``min(delta, 1 + eps_high)`` and negative ones
    above ``max(delta, 1 + eps_high)``."""
    batch = stale_batch(int(delta * 100), scale=0.3)
    cfg = EstimatorConfig(grpo_delta=delta, eps_low=eps_low, eps_high=eps_high)
    grad, stats = ours("grpo", *batch, cfg)
    assert 0 < stats["ratio/frac_tokens_clipped"] < 1
    args = {"delta": delta}
    ref = trl_grad("grpo", batch, args=args, epsilon_low=eps_low, epsilon_high=eps_high)
    torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7)


def test_the_two_sided_clip_below_one_plus_eps_by_hand():
    """r = 1.15 on two one-token responses of advantages +1 and -1, delta 1.1, eps 0.2: TRL's
    objective is flat in the positive one's ratio (capped at 1.1 < 1.15) and pulls the negative one
    (``clip(r) = r`` is the larger term), so the gradients of the mean are (0, +1.15 / 2)."""
    logp_b = torch.full((1, 2, 1), -1.0)
    batch = (logp_b + math.log(1.15), logp_b, torch.ones(1, 2, 1, dtype=torch.bool), torch.tensor([[1.0, -1.0]]))
    expected = torch.tensor([[0.0], [0.575]])
    torch.testing.assert_close(ours("grpo", *batch, EstimatorConfig(grpo_delta=1.1))[0], expected)
    torch.testing.assert_close(trl_grad("grpo", batch, args={"delta": 1.1}), expected)


# -- the mismatch correction (gmc.estimators.mismatch) against verl's rollout_corr_helper ----------

CORRECTIONS = [
    {"rollout_is": "token", "rollout_is_threshold": 2.0},
    {"rollout_is": "sequence", "rollout_is_threshold": 1.5},
    {"rollout_is": "token", "rollout_is_threshold": "0.8_1.3"},
    {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_sum_k1",
        "rollout_rs_threshold": "0.5_2.0",
    },
    {"rollout_rs": "token_k1,seq_mean_k3", "rollout_rs_threshold": "0.7_1.4,0.05"},
    {
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_max_k2,token_k3",
        "rollout_rs_threshold": 0.08,
    },
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("settings", CORRECTIONS)
def test_correction_equals_verl(verl, seed, settings):
    """Weights, rejection mask and every statistic verl names alike, on identical inputs."""
    from gmc.estimators.correction import RolloutCorrection
    from gmc.estimators.losses import as_floats
    from gmc.estimators.mismatch import correct, offpolicy_metrics

    trainer, sampler, mask, _ = stale_batch(seed, scale=0.3)
    trainer, sampler, mask = trainer.reshape(B * G, T), sampler.reshape(B * G, T), mask.reshape(B * G, T)
    resolved = RolloutCorrection(**settings).resolved()
    weights, keep, stats = correct(trainer - sampler, mask, resolved)
    stats = as_floats({**stats, **offpolicy_metrics(trainer, sampler, mask)})
    proto, ref_mask, ref_stats = verl.corr.compute_rollout_correction_and_rejection_mask(
        old_log_prob=trainer,
        rollout_log_prob=sampler,
        response_mask=mask.float(),
        rollout_is=resolved["rollout_is"],
        rollout_is_threshold=resolved["rollout_is_threshold"],
        rollout_rs=resolved["rollout_rs"],
        rollout_rs_threshold=resolved["rollout_rs_threshold"],
    )
    assert torch.equal(keep, ref_mask.bool())
    if weights is not None:
        torch.testing.assert_close(weights, proto.batch["rollout_is_weights"], rtol=1e-6, atol=1e-7)
    shared = set(stats) & set(ref_stats)
    assert len(shared) >= 15
    for name in shared:
        assert stats[name] == pytest.approx(ref_stats[name], rel=1e-5, abs=1e-6), name


def test_presets_equal_verl(verl):
    from gmc.estimators.correction import PRESETS, RolloutCorrection

    keys = ("rollout_is", "rollout_is_threshold", "rollout_rs", "rollout_rs_threshold", "bypass_mode")
    for name in PRESETS:
        theirs = getattr(verl.RolloutCorrectionConfig, name)()
        ours = RolloutCorrection(preset=name).resolved()
        for key in keys:
            expected = getattr(theirs, key)
            if key == "rollout_is_threshold" and ours["rollout_is"] is None:
                continue  # unused without weights
            assert ours[key] == expected, (name, key)


# -- AReaL's decoupled losses, its own functions executed alone -----------------------------------

VENDORED = Path(__file__).parent / "vendored"


def peer_functions(path: Path, *names: str, **namespace):
    """The top-level functions and classes ``names`` of a peer's source file, executed alone in a
    scope of torch, ``dataclasses`` and ``namespace``: AReaL's modules import its whole stack on
    import (its ``areal/__init__.py`` starts the infrastructure: httpx, ray, uvloop, ...), its loss
    functions need torch alone."""
    tree = ast.parse(path.read_text(), str(path))
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name in names]
    assert sorted(n.name for n in body) == sorted(names), path
    scope = {"torch": torch, "dataclass": dataclasses.dataclass, "field": dataclasses.field, "Any": typing.Any}
    scope.update(namespace)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), scope)
    return types.SimpleNamespace(**{n: scope[n] for n in names})


LOSS_FUNCTIONS = (
    "RejectionSamplingResult",
    "_check_bounds",
    "_compute_sequence_level_ratio_and_advantages",
    "apply_rejection_sampling",
    "ppo_actor_loss_fn",
)
"""What AReaL's ``ppo_actor_loss_fn`` calls, in ``areal/utils/functional/functional.py``."""


@pytest.fixture(scope="module")
def areal():
    """AReaL 1.0.4's M2PO (``grpo_loss_fn``'s ``_apply_m2po_masking``, then ``ppo_actor_loss_fn``)
    from the package index's release, installed without its dependencies (``make test-peers``)."""
    try:
        dist = importlib.metadata.distribution("areal")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("AReaL is not installed (make test-peers)")
    assert dist.version == "1.0.4", dist.version
    config = peer_functions(Path(dist.locate_file("areal/api/cli_args.py")), "RejectionSamplingConfig")
    functional = peer_functions(
        Path(dist.locate_file("areal/utils/functional/functional.py")),
        *LOSS_FUNCTIONS,
        RejectionSamplingConfig=config.RejectionSamplingConfig,
    )
    m2po = peer_functions(
        Path(dist.locate_file("areal/trainer/ppo/actor.py")), "_apply_m2po_masking", "_get_m2po_loss_mask"
    )
    return types.SimpleNamespace(**vars(config), **vars(functional), **vars(m2po))


def areal_grad(areal, batch, prox=None, mask=None, rejection_sampling=None, eps=(0.2, 0.2)):
    """The gradient of AReaL's ``ppo_actor_loss_fn`` (decoupled: ``old_logprobs`` the behaviour's,
    ``proximal_logprobs`` ``prox`` or, at a batch's first update, the current policy's), on the
    tokens ``mask`` keeps (default: every valid one)."""
    logp, logp_b, valid, adv = flat(*batch)
    x = logp.clone().requires_grad_(True)
    loss, _ = areal.ppo_actor_loss_fn(
        logprobs=x,
        proximal_logprobs=logp.detach() if prox is None else prox,
        old_logprobs=logp_b,
        advantages=adv,
        eps_clip=eps[0],
        eps_clip_higher=eps[1],
        loss_mask=valid.bool() if mask is None else mask,
        rejection_sampling=rejection_sampling,
    )
    loss.backward()
    return x.grad


def a_later_update(batch, seed):
    """The proximal log-probs ``[B*G, T]`` of a batch's later update: the current policy moved on
    from them far enough that PPO's clip of ``pi / pi_prox`` switches some tokens off."""
    g = torch.Generator().manual_seed(100 + seed)
    logp = batch[0].reshape(B * G, T)
    return (logp + 0.3 * torch.randn(logp.shape, generator=g)).clamp(max=-1e-3)


@pytest.mark.parametrize("later", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_m2po_equals_areal_with_its_behaviour_weight(areal, seed, later):
    """AReaL's M2PO (``m2_threshold``, ``use_decoupled_loss``) with a ``rejection_sampling`` that
    rejects nothing, so that its behaviour weight ``pi_prox / mu`` applies: the M2PO mask of
    ``(log pi_prox - log mu)^2`` over the batch, PPO's clip of ``pi / pi_prox``, the kept tokens'
    count the denominator. Without ``rejection_sampling`` AReaL leaves the behaviour weight out:
    its gradient is ours divided by ``pi_prox / mu`` on every kept token."""
    batch = stale_batch(seed)
    logp, logp_b, valid, _ = flat(*batch)
    prox = a_later_update(batch, seed) if later else None
    kwargs = {} if prox is None else {"prox_logp": prox.reshape(B, G, T)}
    x = batch[0].clone().requires_grad_(True)
    cfg = REGISTRY["m2po"].resolved(EstimatorConfig())
    loss, stats = get_estimator("m2po")(x, *batch[1:], cfg, **kwargs)
    loss.backward()
    grad = x.grad.reshape(B * G, T)
    assert 0 < stats["ratio/frac_tokens_masked"] < 1
    proximal = logp if prox is None else prox
    kept = areal._apply_m2po_masking(logp_b, proximal, valid.bool(), 0.04)
    nothing_rejected = areal.RejectionSamplingConfig(metric="ratio", upper=1e30)
    ref = areal_grad(areal, batch, prox, kept, rejection_sampling=nothing_rejected)
    assert ref.abs().sum() > 0
    torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7)
    unweighted = areal_grad(areal, batch, prox, kept)
    torch.testing.assert_close(grad, unweighted * torch.exp(proximal - logp_b) * kept, rtol=1e-5, atol=1e-7)
    if later:
        first = areal_grad(areal, batch, None, kept, rejection_sampling=nothing_rejected)
        assert not torch.allclose(ref, first)  # the proximal clip fires


@pytest.fixture(scope="module")
def areal2():
    """AReaL 2.0.0's loss functions (``vendored/areal-2.0.0``: the package index has AReaL up to 1.0.4,
    and KPop's binary KL first ships in 2.0.0)."""
    path = VENDORED / "areal-2.0.0" / "functional.py"
    return peer_functions(
        path, *LOSS_FUNCTIONS, "compute_binary_kl_divergence", RejectionSamplingConfig=types.SimpleNamespace
    )


@pytest.mark.parametrize("later", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kpop_equals_areal(areal2, seed, later):
    """AReaL 2.0.0's KPop (``rejection_sampling`` with ``level=token``, ``action=mask``,
    ``metric=binary_kl``; its example's settings but for the threshold, tightened so that it
    masks here): the larger binary KL between the proximal and behaviour probabilities, the
    behaviour weight, PPO's clip of ``pi / pi_prox``, every valid token the denominator."""
    batch = stale_batch(seed)
    prox = a_later_update(batch, seed) if later else None
    kwargs = {} if prox is None else {"prox_logp": prox.reshape(B, G, T)}
    x = batch[0].clone().requires_grad_(True)
    cfg = REGISTRY["kpop"].resolved(EstimatorConfig(kpop_threshold=0.02))
    loss, stats = get_estimator("kpop")(x, *batch[1:], cfg, **kwargs)
    loss.backward()
    assert 0 < stats["ratio/frac_tokens_masked"] < 1
    kpop = types.SimpleNamespace(level="token", action="mask", metric="binary_kl", agg="mean", upper=0.02, lower=None)
    ref = areal_grad(areal2, batch, prox, rejection_sampling=kpop)
    torch.testing.assert_close(x.grad.reshape(B * G, T), ref, rtol=1e-5, atol=1e-7)
