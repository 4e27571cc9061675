"""The log-prob pass and the update (gmc.policy.logprobs, gmc.policy.update): canonical
micro-batches, batch-independent log-probs, and a micro-batched step that equals the whole-batch
step for every estimator, with and without KL."""

import copy
import os

import pytest
import torch
from helpers import grads, naive_logprobs, random_groups, random_model, with_sampler

from gmc.estimators import REGISTRY, EstimatorConfig, get_estimator, group_advantages
from gmc.policy.logprobs import Rows, canonical_length, micro_batches, padded_tokens, sequence_logprobs
from gmc.policy.update import Update


def test_canonical_length_depends_on_the_row_alone_and_wastes_little():
    for n in range(1, 5000):
        c = canonical_length(n)
        assert n <= c and c % 8 == 0
        assert c - n < max(8, n / 32 + 1)
    assert canonical_length(16) == 16 and canonical_length(17) == 24 and canonical_length(511) == 512
    assert canonical_length(513) == 528 and canonical_length(4160) == 4224  # the paper's 64 + 4,096 tokens: 1.5%


def test_micro_batches_cover_every_row_once_within_the_budget():
    lengths = [5, 70, 17, 33, 1, 64, 200, 15, 16, 90]
    for budget in (0, 1, 64, 100, 500, 10_000):
        plan = micro_batches(lengths, budget)
        assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
        for mb in plan:
            widths = {canonical_length(lengths[i]) for i in mb}
            assert len(widths) == 1
            assert budget == 0 or len(mb) == 1 or len(mb) * widths.pop() <= budget
    assert len(micro_batches(lengths, 0)) == len({canonical_length(n) for n in lengths})
    with pytest.raises(ValueError):
        micro_batches(lengths, -1)


BATCH_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
"""Largest log-prob difference allowed between a row alone and in a batch when the math library
may choose its kernel or its split across threads by the rows a product holds: float32 or
bfloat16 rounding of two summation orders, as :data:`CAUSAL_TOL`. Measured: 4.8e-7 in float32 on
a 2-thread AVX-512 machine, and on one thread with ``MKL_CBWR=COMPATIBLE`` (2 of 320 values, on a
2-core AVX-512 machine with MKL 2024.2); 0 in float32 and bfloat16 at 2 threads on that machine
with MKL's own dispatch; 0 everywhere on one thread with MKL's own dispatch."""


def mkl_dispatch_is_its_own() -> bool:
    """Whether MKL picks its kernels for this processor (``MKL_CBWR`` unset or ``AUTO``), the
    setting under which one thread gives a row the same kernels in every batch."""
    return os.environ.get("MKL_CBWR", "AUTO").split(",")[0] in ("", "AUTO")


@pytest.mark.parametrize("threads", [1, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_do_not_depend_on_the_batch(dtype, threads):
    """A row's log-probs alone, in a whole batch, or under any budget: bit-identical on one
    thread with MKL's own dispatch, where every canonical micro-batch meets the same kernels,
    also in bfloat16, where different padding alone moves a trajectory by ~1e-3 nats; within
    :data:`BATCH_TOL` with the machine's threads or another ``MKL_CBWR`` branch (which may take a
    kernel by the product's row count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        model = random_model(dtype=dtype)
        rows = Rows.from_groups(random_groups(B=4, G=4))
        whole = sequence_logprobs(model, rows, 0, pad_id=0)
        tol = 0.0 if threads == 1 and mkl_dispatch_is_its_own() else BATCH_TOL[dtype]
        for budget in (1, 64, 200):
            torch.testing.assert_close(sequence_logprobs(model, rows, budget, pad_id=0), whole, rtol=0, atol=tol)
        for i in (0, 5, 13):
            alone = Rows([rows.sequences[i]], [rows.prompt_lengths[i]], [rows.lengths[i]])
            lp = sequence_logprobs(model, alone, 0, pad_id=0)[0]
            torch.testing.assert_close(lp[: rows.lengths[i]], whole[i, : rows.lengths[i]], rtol=0, atol=tol)
    finally:
        torch.set_num_threads(before)
    assert model.training is True  # the mode of the training forward, restored afterwards
    model.eval()
    sequence_logprobs(model, rows, 64, pad_id=0)
    assert model.training is False


def test_the_no_grad_pass_casts_weights_where_they_are_used_to_the_same_values():
    """Over float32 masters in bfloat16 the no-grad pass runs without autocast's weight cache
    (no bfloat16 copy of every weight beside vLLM): its log-probs equal, bit for bit, those of
    the training forward under the cached autocast, so on-policy ratios stay exactly 1."""
    from gmc.policy.logprobs import micro_batch_logprobs, precision

    model = random_model().train()
    rows = Rows.from_groups(random_groups(B=3, G=4))
    plain = sequence_logprobs(model, rows, 64, pad_id=0, compute_dtype=torch.bfloat16)
    for idx in rows.plan(64):
        with precision(model, torch.bfloat16):  # the training forward: grad on, cache on
            lp = micro_batch_logprobs(model, rows, idx, 0, 1.0, 4096, "causal")
        assert lp.requires_grad
        assert torch.equal(lp.detach(), plain[idx, : lp.shape[1]])


CAUSAL_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
"""Largest log-prob difference allowed between the causal (no mask) and the masked attention
paths: float32 rounding of two kernels' summation orders; in bfloat16 (8 mantissa bits) a logit
of size ~10 moves by ~0.04 between orders, its log-prob by less. Measured here: 0 in both."""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_the_causal_path_equals_the_masked_one(name, dtype):
    """Right-padded rows without an attention mask: the same log-probs, loss, statistics and
    gradient as with the explicit padding mask, within rounding (:data:`CAUSAL_TOL`)."""
    groups = random_groups(seed=3)
    rows = Rows.from_groups(groups)
    model = random_model(seed=4)
    compute = None if dtype == torch.float32 else dtype
    masked = sequence_logprobs(model, rows, 64, pad_id=0, compute_dtype=compute, attention="masked")
    causal = sequence_logprobs(model, rows, 64, pad_id=0, compute_dtype=compute, attention="causal")
    assert (masked - causal).abs().max() <= CAUSAL_TOL[dtype]
    results = {}
    for attention in ("masked", "causal"):
        update = Update(
            model,
            get_estimator(name),
            REGISTRY[name].resolved(EstimatorConfig()),
            64,
            pad_id=0,
            compute_dtype=compute,
            attention=attention,
            max_new_tokens=20,
        )
        loss, stats, _ = update.backward(groups, on_policy=False)
        results[attention] = (float(loss), stats, grads(model))
        model.zero_grad(set_to_none=True)
    (la, sa, ga), (lb, sb, gb) = results["masked"], results["causal"]
    rel = 1e-4 if dtype == torch.float32 else 5e-2
    assert lb == pytest.approx(la, rel=rel, abs=1e-6)
    for key in sa:
        assert sb[key] == pytest.approx(sa[key], rel=rel, abs=1e-5 if dtype == torch.float32 else 1e-2), key
    for x, y in zip(ga, gb):
        torch.testing.assert_close(y, x, rtol=rel, atol=1e-6 if dtype == torch.float32 else 1e-3)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_a_naive_full_forward(temperature):
    model = random_model()
    rows = Rows.from_groups(random_groups())
    fast = sequence_logprobs(model, rows, 64, pad_id=0, temperature=temperature, chunk_size=7)
    with torch.no_grad():
        for i, ref in enumerate(naive_logprobs(model, rows, temperature)):
            torch.testing.assert_close(fast[i, : len(ref)], ref, rtol=0, atol=2e-5)
            assert torch.all(fast[i, len(ref) :] == 0)


def step(
    model, groups, name, budget, kl_coef=0.0, on_policy=False, reference=None, per_row=None, mask_denominator=None
):
    """One update's ``(loss, stats, gradients)``; ``per_row`` None: as the trainer decides it."""
    model.zero_grad(set_to_none=True)
    cfg = REGISTRY[name].resolved(EstimatorConfig(kl_coef=kl_coef, mask_denominator=mask_denominator))
    if per_row is None:
        per_row = not REGISTRY[name].needs_batch_stats_under(cfg)
    update = Update(
        model,
        get_estimator(name),
        cfg,
        budget,
        pad_id=0,
        reference=reference,
        chunk_size=16,
        per_row=per_row,
        max_new_tokens=20,
    )
    loss, stats, _ = update.backward(groups, on_policy)
    return loss, stats, grads(model)


def no_grad_forwards(model, run):
    """``run()``'s result and how many of the model's forwards while it ran were without gradient."""
    calls = []
    hook = model.get_decoder().register_forward_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    try:
        result = run()
    finally:
        hook.remove()
    return result, calls.count(False)


@pytest.mark.parametrize("denominator", [None, "kept"])
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_loss_that_splits_per_row_needs_no_pass_before_backward(name, denominator):
    """The trainer's choice: an estimator whose loss needs no batch statistics runs each
    micro-batch's forward once, with gradient, and gives the loss, statistics and gradient of the
    step with the no-grad pass (``per_row=False``) to the bit; one that needs them keeps the pass."""
    model, reference = random_model(seed=1), random_model(seed=2)
    groups = random_groups(seed=3)
    needs = REGISTRY[name].needs_batch_stats_under(
        REGISTRY[name].resolved(EstimatorConfig(mask_denominator=denominator))
    )
    for kl_coef, on_policy in ((0.0, False), (0.3, False), (0.3, True)):
        args = (model, groups, name, 64, kl_coef, on_policy, reference if kl_coef else None)
        two_pass = step(*args, per_row=False, mask_denominator=denominator)
        chosen, passes = no_grad_forwards(model, lambda a=args: step(*a, mask_denominator=denominator))
        assert passes == (len(Rows.from_groups(groups).plan(64)) if needs else 0)
        assert torch.equal(chosen[0], two_pass[0]) and chosen[1] == two_pass[1]
        for a, b in zip(chosen[2], two_pass[2]):
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["grpo", "gmc"])
def test_a_step_reads_its_statistics_from_the_device_once(name, monkeypatch):
    """Per-row (grpo) or two-pass (gmc), however many micro-batches: the statistics are read back
    once a step, so the host never waits on the device between micro-batches."""
    import gmc.estimators.losses as losses

    reads = []
    real = losses.as_floats
    monkeypatch.setattr(losses, "as_floats", lambda stats: reads.append(1) or real(stats))
    groups = random_groups(B=4, G=4, seed=5)
    n_micro = len(Rows.from_groups(groups).plan(32))
    assert n_micro > 3
    _, stats, _ = step(random_model(seed=1), groups, name, 32)
    assert len(reads) == 1 and all(isinstance(v, float) for v in stats.values())


def assert_same_step(got, base, stats_rtol=1e-5):
    """Two steps' ``(loss, stats, gradients)`` equal to float32 rounding."""
    (loss, stats, grads_), (base_loss, base_stats, base_grads) = got, base
    assert float(loss) == pytest.approx(float(base_loss), rel=1e-5, abs=1e-7)
    assert stats.keys() == base_stats.keys()
    for key in stats:
        assert stats[key] == pytest.approx(base_stats[key], rel=stats_rtol, abs=1e-6), key
    for a, b in zip(grads_, base_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("kl_coef", [0.0, 0.3])
def test_micro_batched_step_equals_the_whole_batch_step(name, kl_coef):
    model = random_model(seed=1)
    reference = random_model(seed=2) if kl_coef else None
    for on_policy in (False, True):
        groups = random_groups(seed=3, stale=not on_policy)
        base_loss, base_stats, base_grads = step(model, groups, name, 0, kl_coef, on_policy, reference)
        assert sum(float(g.abs().sum()) for g in base_grads) > 0
        for budget in (32, 64, 1000):
            assert_same_step(
                step(model, groups, name, budget, kl_coef, on_policy, reference), (base_loss, base_stats, base_grads)
            )


@pytest.mark.parametrize("name", ["grpo", "gmc"])
def test_whole_batch_step_equals_the_estimator_on_naive_log_probs(name):
    """The update's gradient is the estimator's loss differentiated through log-probs computed
    row by row with the model's own forward (and the k3 KL term to a reference)."""
    model, reference = random_model(seed=4), random_model(seed=5)
    groups = random_groups(seed=6)
    loss, stats, g = step(model, groups, name, 0, kl_coef=0.2, reference=reference)
    rows = Rows.from_groups(groups)
    B, G, T = len(groups), 4, max(rows.lengths)

    def stack(per_row):
        out = torch.zeros(B * G, T)
        for i, lp in enumerate(per_row):
            out[i, : len(lp)] = lp
        return out.view(B, G, T)

    model.zero_grad(set_to_none=True)
    logp = stack(naive_logprobs(model, rows))
    with torch.no_grad():
        ref = stack(naive_logprobs(reference, rows))
    behaviour = torch.zeros(B, G, T)
    for k, grp in enumerate(groups):
        behaviour[k, :, : grp.behaviour_logp.shape[1]] = grp.behaviour_logp
    mask = torch.arange(T).view(1, 1, T) < torch.tensor(rows.lengths).view(B, G, 1)
    adv = group_advantages(torch.stack([grp.rewards for grp in groups]))
    naive_loss, _ = get_estimator(name)(
        logp,
        behaviour,
        mask,
        adv,
        REGISTRY[name].resolved(EstimatorConfig(kl_coef=0.2)),
        ref_logp=ref,
        max_new_tokens=20,
    )
    naive_loss.backward()
    assert float(loss) == pytest.approx(float(naive_loss), rel=1e-4)
    assert stats["loss/kl"] > 0
    for a, b in zip(g, grads(model)):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)


def test_k3_kl_gradient_matches_a_naive_per_token_loop():
    """d/d logp of kl_coef * mean_seq(sum_t k3_t) / T_max with k3 = exp(ref - logp) - (ref - logp) - 1
    is kl_coef * (1 - exp(ref - logp)) / T_max per token: the gradient TRL's beta and verl's
    low_var_kl give."""
    torch.manual_seed(0)
    B, G, T = 2, 3, 5
    logp = (-torch.rand(B, G, T) * 2).requires_grad_(True)
    ref = -torch.rand(B, G, T) * 2
    mask = torch.arange(T).view(1, 1, T) < torch.randint(1, T + 1, (B, G, 1))
    zero_adv = torch.zeros(B, G)
    loss, _ = get_estimator("none")(
        logp,
        logp.detach(),
        mask,
        zero_adv,
        REGISTRY["none"].resolved(EstimatorConfig(kl_coef=0.5)),
        ref_logp=ref,
        max_new_tokens=T,
    )
    loss.backward()
    for b in range(B):
        for g in range(G):
            for t in range(T):
                want = (
                    0.5 * (1 - float(torch.exp(ref[b, g, t] - logp[b, g, t]))) / T / (B * G) if mask[b, g, t] else 0.0
                )
                assert float(logp.grad[b, g, t]) == pytest.approx(want, rel=1e-5, abs=1e-9)


def test_padded_tokens_respect_the_budget():
    rows = Rows.from_groups(random_groups(B=5, G=4))
    width_max = max(canonical_length(len(s)) for s in rows.sequences)
    for budget in (64, 128):
        assert max(padded_tokens(rows, budget)) <= max(budget, width_max)
    assert sum(padded_tokens(rows, 0)) == sum(canonical_length(len(s)) for s in rows.sequences)


def test_estimators_create_tensors_on_their_inputs_device():
    """Run every estimator with CPU inputs while factory functions default to the meta device: a
    tensor built without its inputs' device (a ``torch.quantile`` q made on the CPU, say) lands on
    meta and the call fails."""
    groups = random_groups(seed=8)
    model = random_model(seed=9)
    reference = copy.deepcopy(model)
    for name in sorted(REGISTRY):
        with torch.device("meta"):
            step(model, groups, name, 0, kl_coef=0.1, reference=reference)
            step(model, groups, name, 64, kl_coef=0.0, on_policy=False)


def corrected_step(model, groups, name, budget, correction, on_policy=False, sampler_behaviour=False, per_row=None):
    from gmc.estimators.correction import RolloutCorrection

    model.zero_grad(set_to_none=True)
    cfg = REGISTRY[name].resolved(EstimatorConfig())
    if per_row is None:
        per_row = not REGISTRY[name].needs_batch_stats_under(cfg)
    update = Update(
        model,
        get_estimator(name),
        cfg,
        budget,
        pad_id=0,
        chunk_size=16,
        per_row=per_row,
        max_new_tokens=20,
        correction=RolloutCorrection(**correction).resolved(),
        sampler_behaviour=sampler_behaviour,
    )
    loss, stats, _ = update.backward(groups, on_policy)
    return loss, stats, grads(model)


def test_a_correction_weights_each_tokens_gradient_and_leaves_out_what_it_rejects():
    """REINFORCE (``none``, seq_sum_const) under token TIS and token-k1 rejection of the
    trainer/sampler ratio: the gradient of ``-sum keep * w * A * logp / (20 B G)`` through log-probs
    of the model's own forward, row by row."""
    from gmc.estimators.mismatch import importance_weights, rejection_mask

    model = random_model(seed=4)
    groups = with_sampler(random_groups(seed=6), seed=7)
    correction = {
        "rollout_is": "token",
        "rollout_is_threshold": 1.1,
        "rollout_rs": "token_k1",
        "rollout_rs_threshold": "0.8_1.25",
    }
    _, stats, g = corrected_step(model, groups, "none", 0, correction)
    rows = Rows.from_groups(groups)
    B, G, T = len(groups), 4, max(rows.lengths)
    behaviour, sampler = torch.zeros(B, G, T), torch.zeros(B, G, T)
    for k, grp in enumerate(groups):
        behaviour[k, :, : grp.response_ids.shape[1]] = grp.behaviour_logp
        sampler[k, :, : grp.response_ids.shape[1]] = grp.sampler_logp
    mask = torch.arange(T).view(1, 1, T) < torch.tensor(rows.lengths).view(B, G, 1)
    w, _ = importance_weights(behaviour - sampler, mask, "token", 1.1)
    keep, _ = rejection_mask(behaviour - sampler, mask, "token_k1", "0.8_1.25")
    assert 0 < float(keep.sum()) < float(mask.sum()) and float((w[keep] < 1.1).float().mean()) > 0.2
    adv = group_advantages(torch.stack([grp.rewards for grp in groups]))
    model.zero_grad(set_to_none=True)
    logp = torch.zeros(B * G, T)
    for i, lp in enumerate(naive_logprobs(model, rows)):
        logp[i, : len(lp)] = lp
    (-(keep * w * adv.unsqueeze(-1) * logp.view(B, G, T)).sum() / (20 * B * G)).backward()
    for a, b in zip(g, grads(model)):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)
    assert 0 < stats["rollout_corr/rollout_rs_masked_fraction"] < 1 and "rollout_corr/chi2_seq" in stats


CORRECTED = [
    {"rollout_is": "token", "rollout_is_threshold": 1.2},
    {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.02},
]


@pytest.mark.parametrize("correction", CORRECTED)
@pytest.mark.parametrize("name", ["grpo", "gmc", "tic"])
@pytest.mark.parametrize("mode", ["stale", "on_policy", "bypass"])
def test_a_corrected_step_is_the_same_however_it_is_micro_batched(name, correction, mode):
    """Whole batch, micro-batches with the no-grad pass, and a loss split per row: the same loss,
    statistics and gradient, with the correction's ratio read from the behaviour log-probs (a
    stale batch), or from the step's own forward (an on-policy batch, bypass mode)."""
    model = random_model(seed=1)
    groups = with_sampler(
        random_groups(seed=3, stale=mode != "on_policy"), seed=8, model=model if mode != "stale" else None
    )
    if mode == "bypass":
        for grp in groups:
            grp.behaviour_logp = grp.sampler_logp
    args = dict(on_policy=mode == "on_policy", sampler_behaviour=mode == "bypass")
    base_loss, base_stats, base_grads = corrected_step(model, groups, name, 0, correction, **args)
    assert sum(float(g.abs().sum()) for g in base_grads) > 0
    for budget, per_row in ((32, False), (64, True), (1000, None)):
        assert_same_step(
            corrected_step(model, groups, name, budget, correction, per_row=per_row, **args),
            (base_loss, base_stats, base_grads),
            stats_rtol=1e-4,
        )
    uncorrected = corrected_step(model, groups, name, 0, {}, **args)
    assert any(not torch.allclose(a, b) for a, b in zip(uncorrected[2], base_grads))


def test_compiled_decoder_layers_give_the_eager_step():
    """``compile_layers``: every decoder layer compiled with dynamic shapes; a micro-batched step
    of gmc (two-pass, checkpointed layers) gives the eager step's loss and gradient up to the
    fused kernels' rounding."""
    from gmc.policy.model import checkpoint_layers, compile_layers

    groups = random_groups(seed=3)
    eager = random_model(seed=1)
    checkpoint_layers(eager, 1)
    base = step(eager, groups, "gmc", 64)
    compiled = copy.deepcopy(eager)
    compile_layers(compiled)
    got = step(compiled, groups, "gmc", 64)
    assert float(got[0]) == pytest.approx(float(base[0]), rel=1e-4, abs=1e-6)
    for a, b in zip(got[2], base[2]):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
