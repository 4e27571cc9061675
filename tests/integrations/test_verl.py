"""gmc's estimators as verl policy losses (gmc.integrations.verl), against gmc's own losses and verl's
own code: every ``gmc_<name>`` called through verl's ``get_policy_loss_fn`` on two micro-batches of
shuffled rows sums to gmc's loss and gradient on the whole batch, for each aggregation it accepts;
``gmc_grpo`` equals verl's own PPO loss under verl's normalisers; GMC's weights found by ``uid``
equal ``trajectory_weights``; the plugin registers in a fresh interpreter, by its ``verl.plugins``
entry point and by ``VERL_USE_EXTERNAL_MODULES``; every refusal names its key. ``make test-peers``
puts verl on the path; elsewhere the file skips."""

import dataclasses
import os
import subprocess
import sys
import textwrap
import tomllib

import pytest
import torch
from helpers import STALE_SHAPE, stale_batch

from gmc.estimators import REGISTRY, EstimatorConfig, get_estimator, trajectory_weights

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (make test-peers)")
from verl.workers.config.actor import ActorConfig  # noqa: E402

from gmc.integrations import verl as gv  # noqa: E402

B, G, T = STALE_SHAPE
N = B * G
GROUP_WEIGHTED = gv.GROUP_WEIGHTED_LOSS_MODES["gmc_gmc"]  # the loss the gmc trainers switch gmc_gmc to


@pytest.fixture(autouse=True)
def default_settings():
    """Every test starts and ends with the losses under gmc's default settings."""
    gv.register_losses()
    yield
    gv.register_losses()


def gmc_reference(name, logp, logp_b, mask, adv, aggregation, cfg=None):
    """gmc's loss of the whole batch and its gradient ``[N, T]``."""
    x = logp.clone().requires_grad_(True)
    resolved = REGISTRY[name].resolved(dataclasses.replace(cfg or EstimatorConfig(), aggregation=aggregation))
    loss, stats = get_estimator(name)(x, logp_b, mask, adv, resolved, max_new_tokens=T)
    loss.backward()
    return loss.detach(), x.grad.reshape(N, T), stats


def actor_config(**actor):
    return ActorConfig(strategy="fsdp", rollout_n=G, ppo_micro_batch_size_per_gpu=1, **actor)


def through_verl(loss_mode, old, logp, mask, adv, agg, weights=None, split=(7,), seed=0, **actor):
    """verl's way: the rows shuffled (batch balancing), cut into micro-batches, each one's loss by
    ``get_policy_loss_fn(loss_mode)`` with the global batch's counts, as verl's ``ppo_loss`` passes
    them; the losses summed and their gradients accumulated. Returns the total loss and the
    gradient ``[N, T]`` in the original row order."""
    fn = core_algos.get_policy_loss_fn(loss_mode)
    old, logp, mask = old.reshape(N, T), logp.reshape(N, T), mask.reshape(N, T)
    adv = (adv.reshape(N, 1) * mask).contiguous()  # verl broadcasts the advantage over the response tokens
    config = actor_config(**actor)
    config.global_batch_info.update(
        dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=N, loss_scale_factor=T
    )
    x = logp.clone().requires_grad_(True)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(seed))
    total = torch.zeros(())
    for rows in torch.tensor_split(order, list(split)):
        loss, _ = fn(
            old_log_prob=old[rows],
            log_prob=x[rows],
            advantages=adv[rows],
            response_mask=mask[rows],
            loss_agg_mode=agg,
            config=config,
            rollout_is_weights=None if weights is None else weights[rows],
        )
        loss.backward()
        total = total + loss.detach()
    return total, x.grad


def assert_close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("agg", sorted(gv.AGGREGATIONS))
@pytest.mark.parametrize("name", gv.ROW_LOCAL)
def test_row_local_losses_through_verl_equal_gmc(name, agg):
    logp, logp_b, mask, adv = stale_batch(0)
    loss, grad, _ = gmc_reference(name, logp, logp_b, mask, adv, gv.AGGREGATIONS[agg])
    assert grad.abs().sum() > 0
    total, verl_grad = through_verl(f"gmc_{name}", logp_b, logp, mask, adv, agg)
    assert_close(total, loss)
    assert_close(verl_grad, grad)


@pytest.mark.parametrize("agg", sorted(gv.AGGREGATIONS))
def test_gmc_grpo_equals_verls_own_ppo_loss_under_its_normalisers(agg):
    """The rescaling is verl's: gmc_grpo and verl's ``vanilla`` PPO loss (dual clip out of reach)
    give one gradient on the same micro-batches (the values differ where the clip binds: gmc's
    clipped term is 0, verl's the constant ``-clip(r) A``)."""
    logp, logp_b, mask, adv = stale_batch(1)
    _, ours = through_verl("gmc_grpo", logp_b, logp, mask, adv, agg, clip_ratio_c=100.0)
    _, theirs = through_verl("vanilla", logp_b, logp, mask, adv, agg, clip_ratio_c=100.0)
    assert ours.abs().sum() > 0
    assert_close(ours, theirs)


def shuffled_group_weights(logp, logp_b, mask, seed=0):
    """GMC's weights by uid on the rows in a shuffled order, returned in the original order ``[N]``."""
    order = torch.randperm(N, generator=torch.Generator().manual_seed(seed))
    uid = [f"prompt-{int(i) // G}" for i in order]
    w, stats = gv.group_weights(
        uid, logp.reshape(N, T)[order], logp_b.reshape(N, T)[order], mask.reshape(N, T)[order], group_size=G
    )
    back = torch.empty_like(w)
    back[order] = w
    return back, stats


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_weights_by_uid_on_shuffled_rows_equal_trajectory_weights(seed):
    logp, logp_b, mask, _ = stale_batch(seed, scale=0.3)
    w, stats = shuffled_group_weights(logp, logp_b, mask, seed)
    L = torch.where(mask, logp - logp_b, 0.0).sum(-1)
    expected = trajectory_weights("gmc", L, EstimatorConfig().eps)
    assert 0 < stats["gmc/ratio/frac_groups_capped"] < 1
    assert_close(w, expected.reshape(N))


def test_the_trainers_weights_from_transfer_queue_rows_are_trajectory_weights_on_each_valid_token():
    """The rows as verl's v1 trainer reads them from its TransferQueue (uid, nested per-row
    tensors of each response's length), shuffled: each row's weight on each of its tokens."""
    from tensordict import NonTensorStack, TensorDict

    logp, logp_b, mask, _ = stale_batch(1, scale=0.3)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(1))
    lengths = mask.reshape(N, T).sum(-1)[order]

    def nested(x):
        rows = x.reshape(N, T)[order]
        return torch.nested.as_nested_tensor([r[:n] for r, n in zip(rows, lengths)], layout=torch.jagged)

    rows = TensorDict(
        {
            "uid": NonTensorStack(*[f"prompt-{int(i) // G}" for i in order]),
            "response_mask": nested(mask.long()),
            "old_log_probs": nested(logp),
            "rollout_log_probs": nested(logp_b),
        },
        batch_size=N,
    )
    weights, stats = gv.nested_group_weights(rows, G)
    L = torch.where(mask, logp - logp_b, 0.0).sum(-1)
    expected = trajectory_weights("gmc", L, EstimatorConfig().eps).reshape(N)[order]
    assert 0 < stats["gmc/ratio/frac_groups_capped"] < 1
    for row, w, n in zip(weights.unbind(), expected, lengths):
        assert_close(row, w.expand(int(n)))


@pytest.mark.parametrize("agg", sorted(gv.AGGREGATIONS))
def test_gmc_gmc_with_its_group_weights_equals_gmc(agg):
    """The driver's weights (the trainer's log-probs at the step against the sampler's) passed per
    row in ``rollout_is_weights``; one update a batch, so the loss's ``old_log_prob`` is the
    current policy's."""
    logp, logp_b, mask, adv = stale_batch(0, scale=0.3)
    loss, grad, stats = gmc_reference("gmc", logp, logp_b, mask, adv, gv.AGGREGATIONS[agg])
    assert 0 < stats["ratio/frac_groups_capped"] < 1
    w, _ = shuffled_group_weights(logp, logp_b, mask)
    weights = w.unsqueeze(-1) * mask.reshape(N, T)
    total, verl_grad = through_verl(GROUP_WEIGHTED, logp, logp, mask, adv, agg, weights=weights)
    assert_close(total, loss)
    assert_close(verl_grad, grad)


def ragged(rows, lengths):
    """Rows ``[n, T]`` as verl's actor holds them: a nested tensor of each response's length."""
    return torch.nested.as_nested_tensor([r[: int(k)] for r, k in zip(rows, lengths)], layout=torch.jagged)


@pytest.mark.parametrize("agg", sorted(gv.AGGREGATIONS))
def test_gmc_gmc_from_the_trainers_rows_through_verls_actor_loss_equals_gmc(agg):
    """The whole path: the trainer's weights from TransferQueue rows (shuffled), written as nested
    ``rollout_is_weights``, then verl's own actor loss (``ppo_loss``: unpadding, the global counts,
    the registry) on two micro-batches, sums to gmc's ``gmc`` loss and gradient."""
    from tensordict import NonTensorStack, TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.config.actor import PolicyLossConfig
    from verl.workers.utils.losses import ppo_loss

    logp, logp_b, mask, adv = stale_batch(0, scale=0.3)
    loss, grad, _ = gmc_reference("gmc", logp, logp_b, mask, adv, gv.AGGREGATIONS[agg])
    order = torch.randperm(N, generator=torch.Generator().manual_seed(4))
    lengths = mask.reshape(N, T).sum(-1)[order]
    current, behaviour = logp.reshape(N, T)[order], logp_b.reshape(N, T)[order]
    rows = TensorDict(
        {
            "uid": NonTensorStack(*[f"prompt-{int(i) // G}" for i in order]),
            "response_mask": ragged(torch.ones(N, T, dtype=torch.long), lengths),
            "old_log_probs": ragged(current, lengths),
            "rollout_log_probs": ragged(behaviour, lengths),
        },
        batch_size=N,
    )
    weights, _ = gv.nested_group_weights(rows, G)
    config = actor_config(
        policy_loss=PolicyLossConfig(loss_mode=GROUP_WEIGHTED), loss_agg_mode=agg, loss_scale_factor=T
    )
    x = current.clone().requires_grad_(True)
    total = torch.zeros(())
    for part in torch.tensor_split(torch.arange(N), [9]):
        n = lengths[part]
        data = TensorDict(
            {
                "prompts": ragged(torch.ones(len(part), 2, dtype=torch.long), [2] * len(part)),
                "responses": ragged(torch.ones(len(part), T, dtype=torch.long), n),
                "response_mask": ragged(torch.ones(len(part), T, dtype=torch.long), n),
                "old_log_probs": ragged(current[part], n),
                "advantages": ragged(adv.reshape(N)[order][part].unsqueeze(-1).expand(-1, T), n),
                "rollout_is_weights": torch.nested.as_nested_tensor(
                    [weights.unbind()[int(i)] for i in part], layout=torch.jagged
                ),
            },
            batch_size=len(part),
        )
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(lengths.sum()), global_batch_size=N)
        # the model's output over prompt and response, whose response part verl shifts out by one
        pad = torch.zeros(1)
        output = torch.nested.as_nested_tensor(
            [torch.cat([pad, x[int(i), : int(k)], pad]) for i, k in zip(part, n)], layout=torch.jagged
        )
        value, _ = ppo_loss(config, {"log_probs": output}, data)
        value.backward()
        total = total + value.detach()
    back = torch.empty_like(x.grad)
    back[order] = x.grad
    assert_close(total, loss)
    assert_close(back, grad)


def test_verls_rollout_is_weights_multiply_each_tokens_gradient():
    """verl's decoupled-mode weights reach a row-local loss as gmc's rollout correction applies
    them: each token's gradient times its weight, the loss unchanged."""
    logp, logp_b, mask, adv = stale_batch(2)
    loss, grad, _ = gmc_reference("tis", logp, logp_b, mask, adv, "token_mean")
    weights = torch.rand(N, T, generator=torch.Generator().manual_seed(3)) * mask.reshape(N, T)
    total, verl_grad = through_verl("gmc_tis", logp_b, logp, mask, adv, "token-mean", weights=weights)
    assert_close(total, loss)
    assert_close(verl_grad, grad * weights)


def call(loss_mode, agg="token-mean", weights=None, advantages=None, **actor):
    """One micro-batch through verl's registry, for the refusals."""
    logp, logp_b, mask, adv = stale_batch(0)
    mask = mask.reshape(N, T)
    return core_algos.get_policy_loss_fn(loss_mode)(
        old_log_prob=logp_b.reshape(N, T),
        log_prob=logp.reshape(N, T).requires_grad_(True),
        advantages=(adv.reshape(N, 1) * mask) if advantages is None else advantages,
        response_mask=mask,
        loss_agg_mode=agg,
        config=actor_config(**actor),
        rollout_is_weights=weights,
    )


# verl's sequence-level rollout_is_weights: one weight per response, as GMC's
SEQUENCE_WEIGHTS = (torch.rand(N, 1, generator=torch.Generator().manual_seed(5)) + 0.5).expand(N, T)

REFUSALS = [
    ("agg token-sum", dict(loss_mode="gmc_grpo", agg="token-sum"), "actor_rollout_ref.actor.loss_agg_mode"),
    ("agg seq-sum", dict(loss_mode="gmc_tic", agg="seq-mean-token-sum"), "actor_rollout_ref.actor.loss_agg_mode"),
    (
        "no scale factor",
        dict(loss_mode="gmc_tic", agg="seq-mean-token-sum-norm"),
        "actor_rollout_ref.actor.loss_scale_factor",
    ),
    ("gmc_gmc", dict(loss_mode="gmc_gmc"), "trainer.v1.trainer_mode"),
    ("gmc_gmc sequence weights", dict(loss_mode="gmc_gmc", weights=SEQUENCE_WEIGHTS), "trainer.v1.trainer_mode"),
    ("group weighted, no weights", dict(loss_mode=GROUP_WEIGHTED), "trainer.v1.trainer_mode"),
    (
        "group weighted, epochs",
        dict(loss_mode=GROUP_WEIGHTED, weights=torch.ones(N, T), ppo_epochs=2),
        "actor_rollout_ref.actor.ppo_epochs",
    ),
    ("kpop epochs", dict(loss_mode="gmc_kpop", ppo_epochs=2), "actor_rollout_ref.actor.ppo_epochs"),
    (
        "token weights",
        dict(loss_mode=GROUP_WEIGHTED, weights=torch.rand(N, T) + 0.5),
        "algorithm.rollout_correction.rollout_is",
    ),
    ("advantages", dict(loss_mode="gmc_grpo", advantages=torch.randn(N, T)), "algorithm.adv_estimator"),
    ("m2po", dict(loss_mode="gmc_m2po"), "actor_rollout_ref.actor.policy_loss.loss_mode=gmc_m2po"),
]


@pytest.mark.parametrize("kwargs, key", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_what_cannot_be_exact_is_refused_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        call(**kwargs)


def test_a_losss_metrics_are_gmcs_statistics_of_its_rows_and_none_of_its_groups():
    _, metrics = call("gmc_tic", "seq-mean-token-sum-norm", loss_scale_factor=T)
    assert 0 < metrics["gmc/ratio/frac_traj_capped"] < 1 and "gmc/ratio/shortfall" in metrics
    _, metrics = call(GROUP_WEIGHTED, weights=torch.ones(N, T))
    assert "gmc/loss/pg" in metrics and "gmc/ratio/approx_kl" in metrics
    assert not [k for k in metrics if k.startswith(("gmc/ratio/log_group_mass", "gmc/ratio/ess", "gmc/ratio/weight"))]


def test_a_kept_denominator_is_refused():
    gv.register_losses(EstimatorConfig(mask_denominator="kept"))
    with pytest.raises(ValueError, match=r"estimator\.mask_denominator"):
        call("gmc_icepop")


@pytest.mark.parametrize(
    "settings, key",
    [
        (dict(kl_coef=0.1), "estimator.kl_coef"),
        (dict(length_corrected=True), "estimator.length_corrected"),
        (dict(scale_advantages=False), "algorithm.norm_adv_by_std_in_grpo"),
        (dict(aggregation="token_mean"), "actor_rollout_ref.actor.loss_agg_mode"),
    ],
)
def test_settings_the_losses_cannot_honour_are_refused(settings, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        gv.register_losses(EstimatorConfig(**settings))


def test_another_verl_version_is_refused(monkeypatch):
    monkeypatch.setattr(gv.verl, "__version__", "0.10.0")
    with pytest.raises(RuntimeError, match=r"verl 0\.9\.x"):
        call("gmc_grpo")


def test_a_group_of_another_size_than_rollout_n_is_refused():
    logp, logp_b, mask, _ = stale_batch(0)
    uid = [f"prompt-{i // G}" for i in range(N - 1)] + ["prompt-0"]
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.n=4"):
        gv.group_weights(uid, logp.reshape(N, T), logp_b.reshape(N, T), mask.reshape(N, T), group_size=G)


def test_verls_padding_rows_belong_to_no_group_and_weigh_nothing():
    logp, logp_b, mask, _ = stale_batch(2, scale=0.3)
    pad = 3  # rows verl appends to make a batch divisible, under one uid of their own

    def rows(x):
        return torch.cat([x.reshape(N, T), x.reshape(N, T)[:pad]])

    uid = [f"prompt-{i // G}" for i in range(N)] + ["pad-0"] * pad
    w, _ = gv.group_weights(uid, rows(logp), rows(logp_b), rows(mask), group_size=G, padding=[False] * N + [True] * pad)
    L = torch.where(mask, logp - logp_b, 0.0).sum(-1)
    assert_close(w, torch.cat([trajectory_weights("gmc", L, EstimatorConfig().eps).reshape(N), torch.zeros(pad)]))


def verl_config(mode="sync", **changes):
    """The keys of verl's configuration that check_config reads, a valid gmc_gmc run; ``changes``
    by dotted key."""
    from omegaconf import OmegaConf

    config = OmegaConf.create(
        {
            "data": {"train_batch_size": 8},
            "algorithm": {"rollout_correction": {"bypass_mode": False, "rollout_is": None, "rollout_rs": None}},
            "actor_rollout_ref": {
                "actor": {"policy_loss": {"loss_mode": "gmc_gmc"}, "ppo_epochs": 1, "ppo_mini_batch_size": 8},
                "rollout": {"n": G, "calculate_log_probs": True},
            },
            "trainer": {"v1": {"trainer_mode": mode, "separate_async": {"parameter_sync_step": 1}}},
        }
    )
    for key, value in changes.items():
        OmegaConf.update(config, key, value)
    return config


CONFIG_REFUSALS = [
    ("sync", "algorithm.rollout_correction.bypass_mode", True),
    ("sync", "algorithm.rollout_correction.rollout_is", "token"),
    ("sync", "algorithm.rollout_correction.rollout_rs", "token_k1"),
    ("sync", "actor_rollout_ref.rollout.calculate_log_probs", False),
    ("sync", "actor_rollout_ref.actor.ppo_epochs", 2),
    ("sync", "actor_rollout_ref.actor.ppo_mini_batch_size", 4),
    ("separate_async", "trainer.v1.separate_async.parameter_sync_step", 4),
]


@pytest.mark.parametrize("mode, key, value", CONFIG_REFUSALS, ids=[k for _, k, _ in CONFIG_REFUSALS])
def test_the_trainers_refuse_a_configuration_whose_group_weights_would_not_be_exact(mode, key, value):
    gv.check_config(verl_config(mode), mode)
    gv.check_config(verl_config(mode, **{"actor_rollout_ref.actor.policy_loss.loss_mode": "gmc_tic", key: value}), mode)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        gv.check_config(verl_config(mode, **{key: value}), mode)


LOSS = "actor_rollout_ref.actor.policy_loss.loss_mode"
ROW_LOCAL_CONFIG_REFUSALS = [
    # a proximal policy is the batch's first update's: one update a batch
    ({LOSS: "gmc_kpop", "actor_rollout_ref.actor.ppo_epochs": 2}, "actor_rollout_ref.actor.ppo_epochs"),
    (
        {LOSS: "gmc_kpop", "actor_rollout_ref.actor.ppo_mini_batch_size": 4},
        "actor_rollout_ref.actor.ppo_mini_batch_size",
    ),
    # verl's v1 trainer skips its rollout correction in bypass mode
    (
        {
            LOSS: "gmc_tic",
            "algorithm.rollout_correction.bypass_mode": True,
            "algorithm.rollout_correction.rollout_is": "token",
        },
        "algorithm.rollout_correction.rollout_is",
    ),
    (
        {
            LOSS: "gmc_tis",
            "algorithm.rollout_correction.bypass_mode": True,
            "algorithm.rollout_correction.rollout_rs": "token_k1",
        },
        "algorithm.rollout_correction.rollout_rs",
    ),
]


@pytest.mark.parametrize("changes, key", ROW_LOCAL_CONFIG_REFUSALS, ids=[str(c) for c, _ in ROW_LOCAL_CONFIG_REFUSALS])
def test_the_trainers_refuse_a_configuration_a_row_local_loss_would_not_honour(changes, key):
    loss = changes[LOSS]
    gv.check_config(verl_config(**{LOSS: loss}), "sync")
    gv.check_config(verl_config(**{**changes, LOSS: "vanilla"}), "sync")  # verl's own losses are verl's business
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        gv.check_config(verl_config(**changes), "sync")


TRAINER_PEERS = ("transfer_queue", "zmq", "msgspec", "prometheus_client", "hydra", "omegaconf", "torchdata", "peft")
"""What verl's v1 trainer imports beyond .peers: TransferQueue, pyzmq, msgspec, prometheus_client,
hydra-core 1.4 (1.3 needs antlr 4.9, which gmc's environment replaces by 4.13) with omegaconf
2.4.1, torchdata and peft."""


def import_trainers():
    """gmc.integrations.verl_trainer, or a skip naming the missing package of verl's v1 trainer; any
    other import error fails."""
    try:
        import gmc.integrations.verl_trainer as trainers
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in TRAINER_PEERS:
            raise
        pytest.skip(f"verl's v1 trainer needs {error.name!r}, not in .peers ({', '.join(TRAINER_PEERS)})")
    return trainers


def test_the_gmc_trainers_run_as_verls_mode_and_write_the_group_weights_after_its_advantages(monkeypatch):
    """The trainers of a full verl install (TransferQueue, Hydra), verl's own steps stubbed: the
    mode set back to verl's, the configuration checked, and after verl's advantages the weights
    of the rows TransferQueue holds written back as their ``rollout_is_weights``."""
    trainers = import_trainers()
    from tensordict import NonTensorStack, TensorDict
    from verl.trainer.ppo.v1 import PPOTrainer, get_trainer_cls

    assert get_trainer_cls("gmc_separate_async") is trainers.GMCTrainerSeparateAsync
    monkeypatch.setattr(PPOTrainer, "__init__", lambda self, config: setattr(self, "config", config))
    trainer = trainers.GMCTrainerColocateAsync(verl_config("gmc_colocate_async"))
    assert trainer.config.trainer.v1.trainer_mode == "colocate_async"
    assert trainer.config.actor_rollout_ref.actor.policy_loss.loss_mode == GROUP_WEIGHTED
    assert (
        trainers.GMCTrainerSync(verl_config(**{LOSS: "gmc_tic"}))
        .config["actor_rollout_ref"]
        .actor.policy_loss.loss_mode
        == "gmc_tic"
    )
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.ppo_epochs"):
        trainers.GMCTrainerSync(verl_config(**{"actor_rollout_ref.actor.ppo_epochs": 2}))

    logp, logp_b, mask, _ = stale_batch(1, scale=0.3)
    lengths = mask.reshape(N, T).sum(-1)
    rows = TensorDict(
        {
            "uid": NonTensorStack(*[f"prompt-{i // G}" for i in range(N)]),
            "response_mask": ragged(torch.ones(N, T, dtype=torch.long), lengths),
            "old_log_probs": ragged(logp.reshape(N, T), lengths),
            "rollout_log_probs": ragged(logp_b.reshape(N, T), lengths),
        },
        batch_size=N,
    )
    put = {}

    class TransferQueue:
        def kv_batch_get(self, keys, partition_id, select_fields):
            assert sorted(select_fields) == sorted(rows.keys())
            return rows

        def kv_batch_put(self, keys, partition_id, fields):
            put.update(keys=keys, fields=fields)
            return "the batch after the put"

    class Batch:
        keys, partition_id, tags = [f"key-{i}" for i in range(N)], "train", [{}] * N

        def __len__(self):
            return N

    monkeypatch.setattr(trainers, "tq", TransferQueue())
    monkeypatch.setattr(PPOTrainer, "_compute_advantage", lambda self, batch, metrics: batch)
    metrics = {}
    assert trainer._compute_advantage(Batch(), metrics) == "the batch after the put"
    L = torch.where(mask, logp - logp_b, 0.0).sum(-1)
    expected = trajectory_weights("gmc", L, EstimatorConfig().eps).reshape(N)
    for row, w, n in zip(put["fields"]["rollout_is_weights"].unbind(), expected, lengths):
        assert_close(row, w.expand(int(n)))
    assert put["keys"] == Batch.keys and 0 < metrics["gmc/ratio/frac_groups_capped"] < 1


def fresh_interpreter(env, tmp_path):
    """A Python process that imports verl and looks the losses up, then reads their settings
    (started, not waited for)."""
    script = textwrap.dedent(
        """
        import verl
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        names = [get_policy_loss_fn("gmc_gmc").__name__, get_policy_loss_fn("gmc_tic").__name__]
        from gmc.integrations.verl import settings  # after the look-up: verl loaded it, or nothing did

        print(*names, settings().eps)
        """
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    path = os.pathsep.join([str(tmp_path), *sys.path])
    return subprocess.Popen(
        [sys.executable, "-c", script],
        env={**base, "PYTHONPATH": path, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_plugin_registers_in_a_fresh_interpreter_by_entry_point_and_by_external_modules(tmp_path):
    """By gmc's ``verl.plugins`` entry point alone, and with verl's entry points off by
    ``VERL_USE_EXTERNAL_MODULES``: gmc's module, and a user's module that registers other settings."""
    (tmp_path / "my_gmc_settings.py").write_text(
        "from gmc.estimators import EstimatorConfig\n"
        "from gmc.integrations.verl import register_losses\n"
        "register_losses(EstimatorConfig(eps=0.5))\n"
    )
    runs = {
        "entry point": (fresh_interpreter({}, tmp_path), "0.2"),
        "external modules": (
            fresh_interpreter(
                {
                    "VERL_USE_EXTERNAL_PLUGINS": "none",
                    "VERL_USE_EXTERNAL_MODULES": "gmc.integrations.verl,my_gmc_settings",
                },
                tmp_path,
            ),
            "0.5",
        ),
    }
    for how, (process, eps) in runs.items():
        out, err = process.communicate(timeout=240)
        assert process.returncode == 0, f"{how}: {err[-2000:]}"
        assert out.split() == ["gmc_gmc", "gmc_tic", eps], how


def test_import_verl_loads_the_losses_alone():
    """The trainers import verl's whole v1 trainer stack: no entry point loads them, only
    ``VERL_USE_EXTERNAL_MODULES=gmc.integrations.verl_trainer``."""
    pyproject = os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml")
    with open(pyproject, "rb") as f:
        plugins = tomllib.load(f)["project"]["entry-points"]["verl.plugins"]
    assert plugins == {"gmc": "gmc.integrations.verl"}


@pytest.mark.gpu
@pytest.mark.timeout(1800)
def test_three_steps_of_verl_with_gmc_gmc_on_a_gpu(tmp_path):
    """bench/verl_gpu.sh: verl's trainer, vLLM and gmc_gmc with its group weights, three steps."""
    model = os.environ.get("GMC_VERL_MODEL")
    if not torch.cuda.is_available() or not model:
        pytest.skip("needs a CUDA device and GMC_VERL_MODEL, a local Qwen3 checkpoint (bash bench/verl_gpu.sh)")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "verl_gpu.sh")
    run = subprocess.run(
        ["bash", script, model], env={**os.environ, "OUT": str(tmp_path)}, capture_output=True, text=True, timeout=1700
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = (tmp_path / "verl_gpu.steps").read_text().splitlines()
    assert [line.split()[0] for line in steps] == ["step:1", "step:2", "step:3"]
