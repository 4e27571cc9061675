"""gmc's estimators as verl policy losses (verl 0.9), loaded by verl itself.

``import verl`` loads the ``verl.plugins`` entry point ``gmc`` of this package (``pyproject.toml``)
in every process that imports verl, or, where gmc is on the path but not installed, the module that
``VERL_USE_EXTERNAL_MODULES=gmc.integrations.verl`` names. Importing this module registers, through
verl's ``register_policy_loss``:

* ``gmc_<name>`` for every row-local estimator of :data:`gmc.estimators.REGISTRY` (those whose
  weights follow from each response's own tokens: ``grpo``, ``tic``, ``is``, ``none``, ``gspo``,
  ``tis``, ``cispo``, ``icepop``, ``seq_mask``, ``gmpo``, ``dppo``, ``sapo``, ``kpop``,
  ``dppo_kl``, ``prime_dppo``, ``opsm``). Each is gmc's own loss on verl's micro-batch (taken as
  one group of rows), with verl's ``old_log_prob`` as the behaviour policy, rescaled by a constant
  from the micro-batch's mean to its share of verl's global batch (:func:`verl_share`): verl sums
  the micro-batches' gradients, so the sum is gmc's loss and gradient on the whole batch. verl's
  ``rollout_is_weights`` (its decoupled mode's ``rollout_is``) multiply each token's gradient, as
  gmc's own ``rollout_correction`` does.
* ``gmc_gmc``: group-mass capping, whose weights need the whole group. The driver computes them by
  ``uid`` (:func:`group_weights`, called by the trainers of :mod:`gmc.integrations.verl_trainer`)
  and passes them per row in ``rollout_is_weights``, verl's one per-row channel from the driver
  to the policy loss; the loss multiplies each row's advantage by its weight. Those trainers
  switch the loss to its internal name (:data:`GROUP_WEIGHTED_LOSS_MODES`), the one loss that
  reads the weights; ``gmc_gmc`` itself refuses, so that no other trainer's ``rollout_is_weights``
  (verl's sequence-level ones are constant along a response too) pass for GMC's.
* ``gmc_m2po``, which refuses: its mask is a statistic of the whole batch's tokens.

The trainers are loaded by ``VERL_USE_EXTERNAL_MODULES=gmc.integrations.verl_trainer`` alone (they
import verl's whole v1 trainer stack, which a run with verl's own trainers need not).
:func:`register_losses` registers the losses again under other settings. What cannot be exact is
refused with the verl (or gmc) key to change; docs/integrations.md lists it.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import verl
from tensordict import TensorDict
from torch import Tensor
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import register_policy_loss
from verl.workers.utils.padding import response_to_nested

from gmc.estimators import REGISTRY, EstimatorConfig, gmc_loss, none_loss, trajectory_log_ratios, trajectory_weights

VERL_VERSION = "0.9"
"""The verl minor this module is tested with (``make test-peers``); another one is refused when a
loss is called."""

AGGREGATIONS: dict[str, str] = {
    "token-mean": "token_mean",
    "seq-mean-token-mean": "seq_mean",
    "seq-mean-token-sum-norm": "seq_sum_const",
}
"""verl's ``loss_agg_mode`` -> gmc's aggregation. ``token-mean``: every token of verl's mini-batch
counts once; ``seq-mean-token-mean``: each response's mean, averaged over the mini-batch's
responses; ``seq-mean-token-sum-norm``: each response's sum over the constant
``actor.loss_scale_factor``, averaged over the responses (gmc's ``seq_sum_const``, whose constant is
the generation limit). verl's ``token-sum`` and ``seq-mean-token-sum`` have no gmc equivalent."""

GROUP_WEIGHTED: tuple[str, ...] = ("gmc",)
"""The estimators whose weights need the whole group: computed by ``uid`` in the driver
(:func:`group_weights`) and passed per row."""
GROUP_WEIGHTED_LOSS_MODES: dict[str, str] = {f"gmc_{name}": f"_gmc_{name}_group_weighted" for name in GROUP_WEIGHTED}
"""``loss_mode`` -> the internal loss the gmc trainers switch it to, the only loss that reads
``rollout_is_weights`` as group weights."""
ONE_UPDATE: tuple[str, ...] = GROUP_WEIGHTED + tuple(
    name for name, e in REGISTRY.items() if e.proximal and name not in GROUP_WEIGHTED
)
"""The estimators that need one update a batch: the group-weighted ones (weights computed once a
batch) and those with a proximal policy (``kpop``; gmc's is the policy at the batch's first update,
and the loss, given none, takes the current one, which is that policy only at the first update)."""
ROW_LOCAL: tuple[str, ...] = tuple(name for name, e in REGISTRY.items() if not e.needs_batch_stats)
"""The estimators whose loss on a micro-batch needs nothing beyond its rows."""
REFUSED: tuple[str, ...] = tuple(
    name for name, e in REGISTRY.items() if e.needs_batch_stats and name not in GROUP_WEIGHTED
)
"""The estimators that need statistics of the whole batch's tokens, which no per-row weight
carries (``m2po``): their ``gmc_<name>`` refuses."""

GROUP_STATISTICS: tuple[str, ...] = ("ratio/log_group_mass_", "ratio/ess")
"""gmc's statistics of its groups, which a verl loss's micro-batch does not hold: left out of a
loss's metrics (:func:`group_weights` reports them for ``gmc_gmc``)."""

_settings = EstimatorConfig()


def settings() -> EstimatorConfig:
    """The estimator settings the ``gmc_<name>`` losses and :func:`group_weights` use: gmc's
    defaults, or those :func:`register_losses` was last given."""
    return _settings


def gmc_aggregation(loss_agg_mode: str) -> str:
    """gmc's aggregation for verl's ``loss_agg_mode`` (:data:`AGGREGATIONS`), or an error that
    names the key."""
    if loss_agg_mode not in AGGREGATIONS:
        raise ValueError(
            f"actor_rollout_ref.actor.loss_agg_mode={loss_agg_mode!r} has no gmc equivalent; "
            f"the gmc_* losses take one of {sorted(AGGREGATIONS)}"
        )
    return AGGREGATIONS[loss_agg_mode]


def verl_share(mask: Tensor, aggregation: str, global_batch_info: Mapping[str, Any]) -> Tensor:
    """The constant that turns gmc's loss of a micro-batch (a mean over its own tokens or rows)
    into that micro-batch's share of verl's loss of the global batch (``agg_loss``): gmc's
    divisor over verl's (``batch_num_tokens`` for ``token_mean``, ``global_batch_size`` otherwise;
    without them, as ``agg_loss``, the micro-batch's valid tokens or the responses that have one),
    times ``dp_size``, which the data-parallel mean of the gradients divides out again."""
    dp_size = global_batch_info.get("dp_size") or 1
    if aggregation == "token_mean":
        ours = mask.sum().clamp(min=1)
        theirs = global_batch_info.get("batch_num_tokens")
        theirs = mask.sum() if theirs is None else theirs
    else:
        ours = mask.shape[0]
        theirs = global_batch_info.get("global_batch_size")
        theirs = (mask.sum(-1) > 0).sum() if theirs is None else theirs
    return torch.as_tensor(ours, dtype=torch.float32) / max(float(theirs), 1.0) * dp_size


def per_row(values: Tensor, mask: Tensor, key: str) -> Tensor:
    """The one value each row ``[N, T]`` holds on its valid tokens, ``[N]`` (0 for an empty row),
    or an error naming ``key`` when a row's tokens differ: gmc's estimators take one advantage and
    one trajectory weight per response."""
    m = mask.bool()
    x = values.detach().float()
    value = torch.where(m, x, torch.zeros_like(x)).sum(-1) / m.sum(-1).clamp(min=1)
    spread = torch.where(m, (x - value.unsqueeze(-1)).abs(), torch.zeros_like(x))
    if bool((spread > 1e-6 * (1.0 + value.abs().unsqueeze(-1))).any()):
        raise ValueError(f"{key}: gmc's estimators take one value per response, and a response's tokens differ")
    return value


def _check_version() -> None:
    if not verl.__version__.startswith(VERL_VERSION + "."):
        raise RuntimeError(
            f"gmc.integrations.verl is tested with verl {VERL_VERSION}.x; this is verl {verl.__version__}"
        )


def _loss_scale_factor(config: Any, global_batch_info: Mapping[str, Any]) -> int:
    """``seq_sum_const``'s divisor: verl's ``loss_scale_factor``, which must be set (verl's default
    divides by the micro-batch's padded width, which differs between micro-batches)."""
    factor = global_batch_info.get("loss_scale_factor") or getattr(config, "loss_scale_factor", None)
    if factor is None:
        raise ValueError(
            "actor_rollout_ref.actor.loss_scale_factor: seq-mean-token-sum-norm divides each response by a "
            "constant, gmc's seq_sum_const by the generation limit; set it to data.max_response_length"
        )
    return int(factor)


def _make_loss(name: str, cfg: EstimatorConfig, group_weighted: bool = False) -> Callable:
    """verl's policy loss ``gmc_<name>`` under the settings ``cfg`` (see the module's docstring);
    ``group_weighted``: a group-weighted estimator's internal loss, which reads its weights from
    ``rollout_is_weights`` (``gmc_<name>`` itself refuses)."""
    estimator = REGISTRY[name]
    trainers = (
        f"trainer.v1.trainer_mode: gmc_{name} takes its group weights from a gmc trainer (gmc_sync, "
        "gmc_colocate_async, gmc_separate_async; VERL_USE_EXTERNAL_MODULES=gmc.integrations.verl_trainer), "
        "which computes them by uid"
    )

    def loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        _check_version()
        if name in REFUSED:
            raise ValueError(
                f"actor_rollout_ref.actor.policy_loss.loss_mode=gmc_{name}: {name}'s mask is a statistic of the "
                "whole batch's tokens, which neither a micro-batch nor a per-row weight carries"
            )
        if name in GROUP_WEIGHTED and not group_weighted:
            raise ValueError(trainers + " and switches the loss to its internal name")
        epochs = getattr(config, "ppo_epochs", 1)
        if name in ONE_UPDATE and epochs != 1:
            raise ValueError(
                f"actor_rollout_ref.actor.ppo_epochs={epochs}: gmc_{name} takes one update a batch (its "
                f"{'group weights' if name in GROUP_WEIGHTED else 'proximal policy'} would be stale on a "
                "second pass); set it to 1"
            )
        aggregation = gmc_aggregation(loss_agg_mode)
        resolved = estimator.resolved(dataclasses.replace(cfg, aggregation=aggregation))
        if name not in GROUP_WEIGHTED and estimator.needs_batch_stats_under(resolved):
            raise ValueError(
                f"estimator.mask_denominator='kept': gmc_{name} would divide by the tokens the whole batch "
                "keeps, which a micro-batch does not know; the gmc_* losses take 'all'"
            )
        info = dict(getattr(config, "global_batch_info", None) or {})
        max_new_tokens = _loss_scale_factor(config, info) if aggregation == "seq_sum_const" else None
        mask = response_mask.bool()
        adv = per_row(advantages, mask, "algorithm.adv_estimator")
        logp = log_prob
        if name in GROUP_WEIGHTED:
            if rollout_is_weights is None:
                raise ValueError(trainers + "; no group weights reached the loss")
            adv = adv * per_row(rollout_is_weights, mask, "algorithm.rollout_correction.rollout_is")
            fn = none_loss  # the trajectory loss with the weights in the advantages: coefficient w A
        else:
            fn = estimator.loss_function()
            if rollout_is_weights is not None and log_prob.requires_grad:
                weights = rollout_is_weights.detach()
                logp = log_prob + 0.0  # the same values; only this loss's gradient is weighted
                logp.register_hook(lambda grad: grad * weights)
        value, stats = fn(
            logp[None], old_log_prob[None], mask[None], adv[None], resolved, max_new_tokens=max_new_tokens
        )
        # gmc_gmc's own weights are the driver's: the unit weights of the loss it calls are not reported
        dropped = GROUP_STATISTICS + (("ratio/weight_", "ratio/shortfall") if name in GROUP_WEIGHTED else ())
        metrics = {f"gmc/{k}": v for k, v in stats.items() if not k.startswith(dropped)}
        return value * verl_share(mask, aggregation, info).to(value.device), metrics

    loss.__name__ = loss.__qualname__ = GROUP_WEIGHTED_LOSS_MODES[f"gmc_{name}"] if group_weighted else f"gmc_{name}"
    loss.__doc__ = f"gmc's ``{name}`` estimator as a verl policy loss (gmc.integrations.verl)."
    return loss


def register_losses(cfg: EstimatorConfig | None = None) -> tuple[str, ...]:
    """Register ``gmc_<name>`` for every estimator under the settings ``cfg`` (None: gmc's
    defaults), replacing earlier registrations; returns the names. Settings other than the defaults
    reach verl's workers from a module of the user's that calls this, named in
    ``VERL_USE_EXTERNAL_MODULES`` (verl imports it in every process before the entry points)."""
    global _settings
    cfg = EstimatorConfig() if cfg is None else cfg
    if cfg.kl_coef > 0:
        raise ValueError(
            "estimator.kl_coef: the KL penalty is verl's in a verl run (actor_rollout_ref.actor.use_kl_loss, "
            "kl_loss_coef); set kl_coef to 0"
        )
    if cfg.length_corrected:
        raise ValueError(
            "estimator.length_corrected: a verl run's advantages are verl's (algorithm.adv_estimator), "
            "which gmc's length correction of the rewards does not reach; set it to false"
        )
    if not cfg.scale_advantages:
        raise ValueError(
            "estimator.scale_advantages=false: a verl run's advantages are verl's; set "
            "algorithm.norm_adv_by_std_in_grpo=false instead, and scale_advantages to true"
        )
    if cfg.aggregation is not None:
        raise ValueError(
            f"estimator.aggregation={cfg.aggregation!r}: a verl run's aggregation is verl's; set "
            "actor_rollout_ref.actor.loss_agg_mode instead, and aggregation to null"
        )
    _settings = cfg
    names = []
    for name in REGISTRY:
        register_policy_loss(f"gmc_{name}")(_make_loss(name, cfg))
        names.append(f"gmc_{name}")
    for name in GROUP_WEIGHTED:
        register_policy_loss(GROUP_WEIGHTED_LOSS_MODES[f"gmc_{name}"])(_make_loss(name, cfg, group_weighted=True))
    return tuple(names)


def group_weights(
    uid: Sequence,
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    response_mask: Tensor,
    group_size: int,
    padding: Sequence[bool] | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GMC's trajectory weights ``[N]`` of a batch of ``N`` rows ``[N, T]`` in any order, its
    groups found by ``uid`` (each must hold ``group_size`` rows, verl's ``rollout.n``), and gmc's
    statistics of them (``gmc/ratio/frac_groups_capped``, effective sample size, shortfall, ...).
    ``padding``: the rows verl added to make the batch divisible (its tags' ``is_padding``), which
    belong to no group and get weight 0, as they carry no advantage.

    The ratio is the trainer's policy at the step (``old_log_probs``, verl's decoupled mode) over
    the sampler's (``rollout_log_probs``); with one update a batch the first is the policy the
    loss differentiates, so ``gmc_gmc`` with these weights is gmc's ``gmc`` estimator with the
    sampler as the behaviour policy. Weights by :func:`gmc.estimators.trajectory_weights`,
    statistics by :func:`gmc.estimators.gmc_loss`, both on the rows gathered into groups."""
    rows: dict[str, list[int]] = defaultdict(list)
    for i, key in enumerate(uid):
        if not (padding is not None and padding[i]):
            rows[str(key)].append(i)
    sizes = sorted({len(r) for r in rows.values()})
    if sizes != [group_size]:
        raise ValueError(
            f"actor_rollout_ref.rollout.n={group_size}: gmc's group weights need every uid's group whole, "
            f"{group_size} responses each; this batch's groups have {sizes}"
        )
    index = torch.tensor(list(rows.values()), device=old_log_probs.device)  # [B, G]
    mask = response_mask.bool()
    cfg = settings()
    L = trajectory_log_ratios(old_log_probs, rollout_log_probs, mask)
    weights = torch.zeros_like(L)
    weights[index] = trajectory_weights("gmc", L[index], cfg.eps)
    resolved = REGISTRY["gmc"].resolved(dataclasses.replace(cfg, aggregation="token_mean"))
    _, stats = gmc_loss(
        old_log_probs[index], rollout_log_probs[index], mask[index], torch.zeros_like(L[index]), resolved
    )
    return weights, {f"gmc/{k}": v for k, v in stats.items() if k.startswith("ratio/")}


def nested_group_weights(
    rows: TensorDict, group_size: int, padding: Sequence[bool] | None = None
) -> tuple[Tensor, dict[str, float]]:
    """:func:`group_weights` on rows as verl's v1 trainer holds them (its TransferQueue's fields:
    ``uid``, and the nested ``response_mask``, ``old_log_probs`` and ``rollout_log_probs``; its
    padding rows flagged by ``padding``): the weights on every valid token of their row as a nested
    ``rollout_is_weights``, and the statistics. Padded and unpadded as verl's
    ``_compute_advantage`` does."""
    data = DataProto(batch=rows.to_padded_tensor())
    uid = data.batch.pop("uid").tolist()
    mask = data.batch["response_mask"]
    weights, stats = group_weights(
        uid, data.batch["old_log_probs"], data.batch["rollout_log_probs"], mask, group_size, padding
    )
    return response_to_nested(weights.unsqueeze(-1) * mask.float(), rows["response_mask"]), stats


def _loss_mode(config: Mapping) -> str:
    return config["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"]


def uses_group_weights(config: Mapping) -> bool:
    """Whether verl's configuration ``config`` trains with a group-weighted ``gmc_<name>`` loss
    (under its own name, or the internal one the gmc trainers switch it to)."""
    return _loss_mode(config) in {*GROUP_WEIGHTED_LOSS_MODES, *GROUP_WEIGHTED_LOSS_MODES.values()}


def check_config(config: Mapping, mode: str) -> None:
    """Refuse, with one line naming the key, a verl configuration ``config`` (trainer mode
    ``mode``: ``sync``, ``colocate_async``, ``separate_async``) under which a ``gmc_<name>`` loss
    would not be gmc's: verl's rollout correction set beside bypass mode (whose ``rollout_is`` and
    ``rollout_rs`` verl's v1 trainer skips there); for the losses of :data:`ONE_UPDATE`, more than
    one update a batch (one epoch, one mini-batch of all the batch's prompts); for a group-weighted
    loss, besides, verl's decoupled mode (the trainer's log-probs at the step, ``old_log_probs``)
    with the sampler's log-probs, one update between verl's ``old_log_probs`` passes, and
    ``rollout_is_weights`` free for the weights (no ``rollout_is`` or ``rollout_rs`` of verl's)."""
    internal = {v: k for k, v in GROUP_WEIGHTED_LOSS_MODES.items()}
    loss = internal.get(_loss_mode(config), _loss_mode(config))
    if not loss.startswith("gmc_"):
        return
    name = loss.removeprefix("gmc_")
    correction = config["algorithm"].get("rollout_correction") or {}
    group_weighted = uses_group_weights(config)
    if correction.get("bypass_mode"):
        if group_weighted:
            raise ValueError(
                f"algorithm.rollout_correction.bypass_mode=true: {loss}'s group weights compare the trainer's "
                "log-probs at the step (decoupled mode's old_log_probs) with the sampler's; set it to false"
            )
        for key in ("rollout_is", "rollout_rs"):
            if correction.get(key) is not None:
                raise ValueError(
                    f"algorithm.rollout_correction.{key}={correction[key]!r}: verl's v1 trainer applies no "
                    f"rollout correction in bypass mode, so {loss} would train without it; set it to null"
                )
    if group_weighted:
        for key in ("rollout_is", "rollout_rs"):
            if correction.get(key) is not None:
                raise ValueError(
                    f"algorithm.rollout_correction.{key}={correction[key]!r}: {loss}'s group weights are the "
                    "correction of the sampler's ratio and travel in rollout_is_weights; set it to null"
                )
        if not config["actor_rollout_ref"]["rollout"].get("calculate_log_probs"):
            raise ValueError(
                f"actor_rollout_ref.rollout.calculate_log_probs: {loss}'s group weights need the sampler's "
                "log-probs; set it to true"
            )
        sync_step = (config["trainer"]["v1"].get(mode) or {}).get("parameter_sync_step", 1)
        if sync_step != 1:
            raise ValueError(
                f"trainer.v1.{mode}.parameter_sync_step={sync_step}: after a cycle's first update verl keeps the "
                f"cycle's first policy as old_log_probs, so {loss}'s group weights would not be the ratio of the "
                "policy the update differentiates; set it to 1"
            )
    actor = config["actor_rollout_ref"]["actor"]
    if name in ONE_UPDATE:
        what = "group weights are computed once a batch" if group_weighted else "proximal policy is the batch's first"
        if actor.get("ppo_epochs", 1) != 1:
            raise ValueError(
                f"actor_rollout_ref.actor.ppo_epochs={actor['ppo_epochs']}: {loss}'s {what}, and would be "
                "stale on a second pass; set it to 1"
            )
        prompts = config["data"]["train_batch_size"]
        if actor["ppo_mini_batch_size"] != prompts:
            raise ValueError(
                f"actor_rollout_ref.actor.ppo_mini_batch_size={actor['ppo_mini_batch_size']}: {loss}'s {what}, "
                f"and would be stale after a first mini-batch; set it to data.train_batch_size, {prompts}"
            )


register_losses()
