"""gmc's estimators as the loss of TRL's ``GRPOTrainer`` (TRL 1.16): :class:`GMCGRPOConfig` and
:class:`GMCGRPOTrainer`.

The trainer keeps TRL's generation, rewards, buffering and optimizer loop and replaces two things:

* **the batch's layout.** Where TRL has scored a generation batch
  (``_generate_and_score_completions``), every per-row tensor is laid out as ``[groups, G, ...]``,
  one prompt's ``G`` completions a row, so TRL's shuffle and its split into
  ``steps_per_generation`` micro-batches move whole groups; the advantages are gmc's
  (:func:`gmc.estimators.advantages_for` of TRL's weighted reward sum, with the ``estimator``
  settings' ``scale_advantages`` and ``length_corrected``).
* **the loss** (``_compute_loss``): the estimator's loss of the registry
  (:data:`gmc.estimators.REGISTRY`) on the micro-batch's ``[B, G, T]`` log-probs, the call gmc's
  own update makes (:class:`gmc.policy.update.Update`), with gmc's mismatch correction
  (:func:`gmc.estimators.mismatch.correct`, in bypass mode
  :func:`gmc.estimators.mismatch.correct_bypass`) where ``rollout_correction`` is set, scaled by the
  micro-batch's share of the optimizer step: its rows' share under ``seq_mean`` and
  ``seq_sum_const``, its tokens' share of the step's under ``token_mean``. The loss's statistics
  (``ratio/...``, ``loss/...``, ``rollout_corr/...``) go to TRL's metrics.

The behaviour log-probs are the sampler's where TRL keeps them (vLLM's,
``sampling_per_token_logps``) and TRL's own importance-sampling correction is off; else those
of the policy that generated the batch (TRL's ``old_per_token_logps``, computed when a batch is
trained after an update); else, on-policy, the current policy's, detached. With TRL's vLLM
correction on, its ratio multiplies each token's gradient of the estimator's loss, the KL term's
included, as gmc's update weights a correction's tokens (TRL's own loss multiplies its policy term
only). The sampler's log-probs are of the policy TRL trains only where vLLM applies no sampling
that TRL's training forward does not (:data:`NEUTRAL_SAMPLING`, :data:`SAMPLING_KWARGS`) and
returns processed log-probs, after the temperature (``--logprobs-mode processed_logprobs``, which
``trl vllm-serve`` and TRL's colocated vLLM set).

Importing this module fails with one line unless TRL 1.16 is installed (``pip install
"gmc[trl]"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

try:
    import trl
except ImportError:
    raise ImportError('gmc.integrations.trl needs TRL 1.16: pip install "gmc[trl]" (trl>=1.16,<1.17)') from None
from packaging.version import Version

if Version(trl.__version__).release[:2] != (1, 16):
    raise ImportError(
        f"gmc.integrations.trl is tested with TRL 1.16 and refuses trl {trl.__version__}: "
        'pip install "gmc[trl]" (trl>=1.16,<1.17)'
    )

import torch
from torch import Tensor
from trl import GRPOConfig, GRPOTrainer

from gmc.estimators import REGISTRY, EstimatorConfig, advantages_for
from gmc.estimators.correction import RolloutCorrection
from gmc.estimators.losses import TRAJECTORY_ALGORITHMS, as_floats
from gmc.estimators.mismatch import correct, correct_bypass, offpolicy_metrics
from gmc.settings import ConfigError, from_section

__all__ = ["GMCGRPOConfig", "GMCGRPOTrainer", "UNREAD_TRL_KEYS"]

UNREAD_TRL_KEYS: dict[str, str] = {
    "loss_type": "estimator.aggregation",
    "epsilon": "estimator.eps_low (or the estimator's own bounds)",
    "epsilon_high": "estimator.eps_high (or the estimator's own bounds)",
    "delta": "estimator.grpo_delta",
    "importance_sampling_level": "algorithm: gspo",
    "sapo_temperature_pos": "estimator.sapo_tau_pos",
    "sapo_temperature_neg": "estimator.sapo_tau_neg",
    "off_policy_mask_threshold": "algorithm: opsm with estimator.opsm_threshold",
    "scale_rewards": "estimator.scale_advantages",
    "multi_objective_aggregation": "a weighted sum of the rewards, normalised per group",
    "beta": "estimator.kl_coef",
    "use_bias_correction_kl": "no gmc equivalent",
    "top_entropy_quantile": "no gmc equivalent",
    "entropy_coef": "no gmc equivalent",
    "use_adaptive_entropy": "no gmc equivalent",
}
"""TRL's loss settings that :class:`GMCGRPOTrainer`'s loss does not read, each with what sets the
same thing in gmc: a value other than TRL's default is refused, naming the key, so no setting is
silently dropped."""

NEUTRAL_SAMPLING: dict[str, tuple] = {
    "top_p": (1.0,),
    "top_k": (0, -1, None),
    "min_p": (None, 0.0),
    "repetition_penalty": (1.0,),
}
"""TRL's sampling settings that vLLM applies and TRL's training forward does not, with their
values that change nothing: with ``use_vllm`` (the sampler's log-probs enter the loss) any other
value is refused, naming the key. ``temperature`` is free: TRL's forward divides the logits by it
and vLLM's processed log-probs are after it."""

SAMPLING_KWARGS = (
    "temperature",
    *NEUTRAL_SAMPLING,
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "bad_words",
    "allowed_token_ids",
    "min_tokens",
)
"""Keys of ``generation_kwargs`` that change vLLM's sampling distribution behind TRL's training
forward: refused with ``use_vllm``."""

MULTIMODAL_KEYS = ("pixel_values", "num_images", "image_grid_thw")
"""Inputs of a multimodal batch, whose rows are not one tensor row each: refused."""


@dataclass
class GMCGRPOConfig(GRPOConfig):
    """TRL's ``GRPOConfig`` with the estimator that computes the loss.

    ``algorithm``, ``estimator`` and ``rollout_correction`` hold what the same keys of a gmc run's
    config hold, validated by gmc's settings (an unknown key or a bad value names itself) into
    :attr:`estimator_config` and :attr:`rollout_correction_config`. TRL's loss settings the
    estimator replaces (:data:`UNREAD_TRL_KEYS`) keep their defaults; ``beta`` is set from
    ``estimator.kl_coef`` so that TRL computes the reference log-probs the KL term needs.
    Refused, naming the key: a micro-batch that would split a group (``per_device_train_batch_size``
    not a multiple of ``num_generations``); statistics of the whole optimizer step that a
    micro-batch cannot see (``gradient_accumulation_steps``, ``steps_per_generation``); more than
    one process; ``rollout_correction`` without the sampler's log-probs (``use_vllm``) or together
    with TRL's own correction of the same mismatch (``vllm_importance_sampling_correction``); with
    ``use_vllm``, a sampling TRL's training forward does not apply (``top_p``, ``top_k``,
    ``min_p``, ``repetition_penalty`` and :data:`SAMPLING_KWARGS` in ``generation_kwargs``)."""

    algorithm: str = field(default="gmc", metadata={"help": "gmc's estimator (gmc.estimators.REGISTRY)."})
    estimator: dict = field(
        default_factory=dict, metadata={"help": "gmc's estimator settings (gmc.estimators.EstimatorConfig)."}
    )
    rollout_correction: dict | None = field(
        default=None,
        metadata={"help": "gmc's sampler-mismatch correction (gmc.estimators.correction.RolloutCorrection)."},
    )

    def __post_init__(self):
        if self.algorithm not in REGISTRY:
            raise ConfigError(f"unknown estimator {self.algorithm!r}; known: {list(REGISTRY)}", "algorithm")
        estimator = from_section(EstimatorConfig, dict(self.estimator), "estimator")
        self.estimator_config = REGISTRY[self.algorithm].resolved(estimator)
        self.rollout_correction_config = (
            None
            if self.rollout_correction is None
            else from_section(RolloutCorrection, dict(self.rollout_correction), "rollout_correction")
        )
        defaults = {f.name: f.default for f in fields(GRPOConfig)}
        for key, instead in UNREAD_TRL_KEYS.items():
            if getattr(self, key) != defaults[key]:
                raise ConfigError(f"TRL's loss setting is not read by gmc's loss; set {instead}", key)
        self.beta = self.estimator_config.kl_coef
        super().__post_init__()
        self._check_layout()
        self._check_correction()
        self._check_sampling()

    def _check_layout(self) -> None:
        """Refuse a batch layout in which the estimator's loss could not be gmc's exactly."""
        if self.world_size > 1:
            raise ConfigError(
                f"{self.world_size} processes: GMCGRPOTrainer trains on one, where every micro-batch is whole groups",
                "world_size",
            )
        if self.per_device_train_batch_size % self.num_generations:
            raise ConfigError(
                f"{self.per_device_train_batch_size} rows a micro-batch would split a group of "
                f"num_generations={self.num_generations}: make per_device_train_batch_size a multiple of "
                "num_generations (the batch then grows with steps_per_generation or gradient_accumulation_steps)",
                "per_device_train_batch_size",
            )
        cfg, accumulation = self.estimator_config, self.gradient_accumulation_steps
        if accumulation == 1:
            return
        estimator = REGISTRY[self.algorithm]
        if estimator.needs_batch_stats_under(cfg) and self.algorithm not in TRAJECTORY_ALGORITHMS:
            raise ConfigError(
                f"{self.algorithm} with mask_denominator={cfg.mask_denominator} needs statistics of the whole "
                "optimizer step, which one micro-batch does not see: set gradient_accumulation_steps to 1",
                "gradient_accumulation_steps",
            )
        if cfg.aggregation != "token_mean":
            return
        rejects = self.rollout_correction_config and self.rollout_correction_config.resolved()["rollout_rs"]
        if rejects:
            raise ConfigError(
                "rollout_rs under token_mean divides by the tokens the whole optimizer step keeps, which one "
                "micro-batch does not see: set gradient_accumulation_steps to 1",
                "gradient_accumulation_steps",
            )
        if self.steps_per_generation % accumulation:
            raise ConfigError(
                f"token_mean divides by the optimizer step's tokens, known when its {accumulation} micro-batches "
                f"come from one generation: make steps_per_generation ({self.steps_per_generation}) a multiple of "
                "gradient_accumulation_steps",
                "steps_per_generation",
            )

    def _check_correction(self) -> None:
        """Refuse a mismatch correction without the sampler's log-probs, or counted twice."""
        if self.rollout_correction_config is None:
            return
        if not self.use_vllm:
            raise ConfigError(
                "needs the sampler's log-probs, which TRL keeps when vLLM generates: set use_vllm", "rollout_correction"
            )
        if self.vllm_importance_sampling_correction:
            raise ConfigError(
                "TRL's own correction of the sampler/trainer mismatch would count it a second time beside "
                "rollout_correction: set vllm_importance_sampling_correction to false",
                "vllm_importance_sampling_correction",
            )

    def _check_sampling(self) -> None:
        """Refuse, where the sampler's log-probs enter the loss (``use_vllm``: as the behaviour, in
        ``rollout_correction`` or in TRL's own correction), a sampling that TRL's training forward
        does not apply: the sampler's log-probs would not be the trained policy's."""
        if not self.use_vllm:
            return
        for key, neutral in NEUTRAL_SAMPLING.items():
            if getattr(self, key) not in neutral:
                raise ConfigError(
                    f"vLLM samples with {key}={getattr(self, key)}, which TRL's training forward does not apply, so "
                    f"the sampler's log-probs are not the trained policy's: set {key} to {neutral[0]}",
                    key,
                )
        for key in SAMPLING_KWARGS:
            if key in (self.generation_kwargs or {}):
                raise ConfigError(
                    "changes vLLM's sampling behind TRL's training forward, so the sampler's log-probs are not the "
                    "trained policy's: remove it (temperature is GRPOConfig's own key)",
                    f"generation_kwargs.{key}",
                )


class GMCGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` whose loss is gmc's estimator (:mod:`gmc.integrations.trl`); its
    settings are a :class:`GMCGRPOConfig`."""

    def __init__(self, model, reward_funcs, args: GMCGRPOConfig, **kwargs):
        if not isinstance(args, GMCGRPOConfig):
            raise TypeError(f"GMCGRPOTrainer takes its settings as a GMCGRPOConfig (args), got {type(args).__name__}")
        super().__init__(model, reward_funcs, args=args, **kwargs)
        estimator = REGISTRY[args.algorithm]
        self.gmc_loss = estimator.loss_function()
        self.gmc_proximal = estimator.proximal
        rc = args.rollout_correction_config
        self.gmc_correction = None if rc is None else rc.resolved()
        self._gmc_rewards: Tensor | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._gmc_rewards = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if found := [k for k in MULTIMODAL_KEYS if k in out]:
            raise ValueError(f"GMCGRPOTrainer trains on text; the batch has {found}")
        G = self.num_generations if self.model.training else self.num_generations_eval
        per_func = self._gmc_rewards
        unscorable = torch.isnan(per_func).all(dim=1)
        if unscorable.any():
            raise ValueError(
                f"{int(unscorable.sum())} completions got None from every reward function: gmc's group "
                "advantages need a reward for each (reward_funcs)"
            )
        rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        lengths = out["completion_mask"].sum(-1)
        n = lengths.shape[0]
        packed = {
            k: v.view(n // G, G, *v.shape[1:]) if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == n else v
            for k, v in out.items()
        }
        packed["advantages"] = advantages_for(rewards.view(-1, G), lengths.view(-1, G), self.args.estimator_config)
        return packed

    @staticmethod
    def _loss_mask(inputs: dict) -> Tensor:
        """The tokens the loss sees, ``[B, G, T]``: the completion's, less tool outputs."""
        mask = inputs["completion_mask"]
        return (mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]).bool()

    def _step_share(self, mask: Tensor) -> Tensor | float:
        """This micro-batch's share of the optimizer step's loss: its rows' (every micro-batch has
        as many), or under ``token_mean`` its tokens' among the step's micro-batches (consecutive
        slices of one generation, :class:`GMCGRPOConfig`)."""
        accumulation = self.current_gradient_accumulation_steps
        if self.args.estimator_config.aggregation != "token_mean" or accumulation == 1:
            return 1.0 / accumulation
        first = self._step % self.args.steps_per_generation // accumulation * accumulation
        step = self._buffered_inputs[first : first + accumulation]
        return mask.sum() / sum(self._loss_mask(x).sum() for x in step)

    def _compute_loss(self, model, inputs):
        adv = inputs["advantages"]
        B, G = adv.shape
        mask = self._loss_mask(inputs)
        T = mask.shape[-1]

        def rows(key):
            return inputs[key].reshape(B * G, -1)

        input_ids = torch.cat([rows("prompt_ids"), rows("completion_ids")], dim=1)
        attention = torch.cat([rows("prompt_mask"), rows("completion_mask")], dim=1)
        logp, _, _ = self._get_per_token_logps_and_entropies(model, input_ids, attention, T)
        logp = logp.view(B, G, T)
        current = logp.detach()
        old = inputs.get("old_per_token_logps")
        generating = current if old is None else old  # the trainer's policy at the generating version
        sampler = inputs.get("sampling_per_token_logps")
        if sampler is not None:  # a token vLLM could not score: the trainer's log-prob, ratio 1
            sampler = torch.where(torch.isnan(sampler), generating, sampler)
        trl_weights = inputs.get("importance_sampling_ratio")
        corr = self.gmc_correction
        bypass = corr is not None and corr["bypass_mode"]
        from_sampler = sampler is not None and trl_weights is None and (corr is None or bypass)
        behaviour = sampler if from_sampler else generating
        weights, keep, extra = trl_weights, mask, {}
        if bypass:
            weights, keep, extra = correct_bypass(current - sampler, mask, corr, self.args.estimator_config.aggregation)
        elif corr is not None:
            weights, keep, extra = correct(generating - sampler, mask, corr)
        if sampler is not None:
            extra.update(offpolicy_metrics(current if from_sampler else generating, sampler, mask))
        if weights is not None:
            logp.register_hook(lambda grad: grad * weights)
        proximal = {"prox_logp": old} if self.gmc_proximal and old is not None else {}
        loss, stats = self.gmc_loss(
            logp,
            behaviour,
            keep,
            adv,
            self.args.estimator_config,
            ref_logp=inputs.get("ref_per_token_logps"),
            max_new_tokens=self.max_completion_length,
            **proximal,
        )
        mode = "train" if self.model.training else "eval"
        for name, value in {**stats, **as_floats(extra)}.items():
            self._metrics[mode][name].append(value)
        return loss * self._step_share(mask) if mode == "train" else loss
