"""The sampler/trainer mismatch correction (method.md section 3, "Two sources of off-policy
error"), torch-free: :class:`RolloutCorrection`, the ``rollout_correction`` block of a run's
config, its keys named as verl's ``RolloutCorrectionConfig``, and :data:`PRESETS`, one per verl
preset.

A stale token has two ratios. The *staleness* ratio, current policy over the trainer's policy
at the version that generated the batch, is the estimator's (``algorithm``). The *mismatch*
ratio, that trainer policy over the sampler (the inference engine's own numerics), is this
block's: truncated importance weights (``rollout_is``) multiply each token's gradient, and
rejection (``rollout_rs``) drops tokens or responses from the loss. Decoupled mode keeps the
three policies apart (the trainer's log-probs at the generating version come from the behaviour
pass, ``behaviour_logprobs: trainer``); bypass mode (``bypass_mode: true``) takes the sampler's
log-probs as the behaviour (``behaviour_logprobs: sampler``: no behaviour pass), so the
estimator's ratio is current over sampler and the correction's ratio is the current policy
(detached) over the sampler, as verl's bypass mode. The math is :mod:`gmc.estimators.mismatch`.
"""

from __future__ import annotations

import math
from typing import Literal

from gmc.estimators.registry import DIVERGENCE_METRICS
from gmc.settings import ConfigError, settings

IS_THRESHOLD = 2.0
"""verl's default ``rollout_is_threshold``."""

PRESETS: dict[str, dict] = {
    "disabled": {},
    "decoupled_token_is": {"rollout_is": "token", "rollout_is_threshold": 2.0},
    "decoupled_seq_is": {"rollout_is": "sequence", "rollout_is_threshold": 2.0},
    "decoupled_token_icepop": {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
    "decoupled_seq_is_rs": {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_sum_k1",
        "rollout_rs_threshold": "0.5_2.0",
    },
    "decoupled_geo_rs": {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.999_1.001"},
    "decoupled_geo_rs_seq_tis": {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
    },
    "decoupled_geo_rs_token_tis": {
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
    },
    "decoupled_k3_rs": {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01},
    "decoupled_k3_rs_seq_tis": {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k3",
        "rollout_rs_threshold": 0.01,
    },
    "decoupled_k3_rs_token_tis": {
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k3",
        "rollout_rs_threshold": 0.01,
    },
    "bypass_ppo_clip": {"bypass_mode": True},
    "bypass_ppo_clip_geo_rs": {"bypass_mode": True, "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.999_1.001"},
    "bypass_ppo_clip_k3_rs": {"bypass_mode": True, "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01},
    "bypass_pg_is": {"bypass_mode": True, "rollout_is": "sequence", "rollout_is_threshold": 2.0},
    "bypass_pg_token_icepop": {"bypass_mode": True, "rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
    "bypass_pg_geo_rs": {"bypass_mode": True, "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.999_1.001"},
    "bypass_pg_geo_rs_seq_tis": {
        "bypass_mode": True,
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
    },
    "bypass_pg_geo_rs_token_tis": {
        "bypass_mode": True,
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
    },
}
"""verl's named presets (``RolloutCorrectionConfig.<name>()`` with its default arguments). verl's
``bypass_ppo_clip*`` presets pair with its PPO-clip loss (``algorithm: grpo``), the
``bypass_pg_*`` ones with REINFORCE (``algorithm: none``, the correction's weights then being
the only importance weights); the correction itself stacks on any estimator."""


def parse_is_threshold(spec: float | str) -> tuple[float, float | None]:
    """``rollout_is_threshold`` as ``(upper, lower)``: a number truncates the weights at it
    (TIS; ``lower`` None), ``"lower_upper"`` zeroes the weights outside the band (IcePop)."""
    if isinstance(spec, str) and "_" in spec:
        low, _, high = spec.partition("_")
        upper, lower = _number(high, "rollout_is_threshold"), _number(low, "rollout_is_threshold")
        if lower > upper:
            raise ConfigError(f"the lower bound {lower} exceeds the upper {upper}", "rollout_is_threshold")
        return upper, lower
    return _number(spec, "rollout_is_threshold"), None


def parse_rs(options: str, spec: float | str | None) -> list[tuple[str, float, float]]:
    """``rollout_rs`` (comma-chained criteria, duplicates once) with ``rollout_rs_threshold`` (one
    value for every criterion, or one per criterion) as ``(criterion, low, high)`` in verl's
    terms: a ``*_k1`` criterion keeps a statistic within ``[log low, log high]`` (a single number
    ``u`` meaning ``[1/u, u]``), the others keep a statistic at most ``high`` (``low`` 0)."""
    names = list(dict.fromkeys(o.strip() for o in options.split(",") if o.strip()))
    if not names:
        raise ConfigError("needs at least one criterion", "rollout_rs")
    for name in names:
        if name not in DIVERGENCE_METRICS:
            raise ConfigError(f"unknown criterion {name!r}; known: {list(DIVERGENCE_METRICS)}", "rollout_rs")
    if spec is None:
        raise ConfigError("rejection needs its threshold (verl has no default)", "rollout_rs_threshold")
    specs = [s.strip() for s in spec.split(",") if s.strip()] if isinstance(spec, str) else [spec]
    if len(specs) not in (1, len(names)):
        raise ConfigError(
            f"one threshold for every criterion or one per criterion ({len(names)}), got {len(specs)}",
            "rollout_rs_threshold",
        )
    out = []
    for name, s in zip(names, specs * len(names) if len(specs) == 1 else specs):
        if name.endswith("k1"):
            if isinstance(s, str) and "_" in s:
                low, _, high = s.partition("_")
                low, high = _number(low, "rollout_rs_threshold"), _number(high, "rollout_rs_threshold")
            else:
                high = _number(s, "rollout_rs_threshold")
                low = 1.0 / high
            if low > high:
                raise ConfigError(f"{name}: the lower bound {low} exceeds the upper {high}", "rollout_rs_threshold")
        else:
            if isinstance(s, str) and "_" in s:
                raise ConfigError(f"{name} takes one upper bound, got {s!r}", "rollout_rs_threshold")
            low, high = 0.0, _number(s, "rollout_rs_threshold")
        out.append((name, low, high))
    return out


def _number(value: float | str, key: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise ConfigError(f"not a number: {value!r}", key) from None
    if not (x > 0 and math.isfinite(x)):
        raise ConfigError(f"must be a positive number, got {value!r}", key)
    return x


@settings(prefix="rollout_correction.")
class RolloutCorrection:
    """The mismatch correction stacked on the run's estimator (verl's ``RolloutCorrectionConfig``
    keys; :data:`PRESETS` names verl's presets). A key left unset takes the preset's value, then
    verl's default."""

    preset: Literal[tuple(PRESETS)] | None = None  # type: ignore[valid-type]
    """One of verl's presets (:data:`PRESETS`), whose values the keys below override."""
    rollout_is: Literal["token", "sequence"] | None = None
    """Importance weights of the mismatch ratio: ``token`` (each token's own), ``sequence`` (the
    response's product, on every token); unset: none."""
    rollout_is_threshold: float | str | None = None
    """A number truncates the weights at it (verl's default 2.0); ``"lower_upper"`` zeroes the
    weights outside the band (IcePop)."""
    rollout_rs: str | None = None
    """Rejection criteria, comma-chained, each of :data:`gmc.estimators.registry.DIVERGENCE_METRICS`
    (``token_k1``, ``seq_mean_k3``, ...): a token or response that fails any leaves the loss;
    unset: none."""
    rollout_rs_threshold: float | str | None = None
    """One threshold for every criterion, or one per criterion (comma-separated); a ``*_k1``
    criterion takes ``"lower_upper"`` ratio bounds (a single ``u``: ``[1/u, u]``), the others one
    upper bound."""
    bypass_mode: bool | None = None
    """The sampler's log-probs as the behaviour (``behaviour_logprobs: sampler``; two policies, no
    behaviour pass): the correction's ratio is then the current policy over the sampler. Default
    false: decoupled (three policies)."""
    record_logprobs: bool = True
    """Write every trained token's sampler, generating-version and current log-probs, one file a
    step (``logprobs/step_NNNNNN.pt`` in the run; 12 bytes a token, about 25 MB a step at the
    paper's 32 x 32 answers of 2,000 tokens)."""

    def __post_init__(self) -> None:
        r = self.resolved()
        if r["rollout_is"] is not None:
            parse_is_threshold(r["rollout_is_threshold"])
        if r["rollout_rs"] is not None:
            parse_rs(r["rollout_rs"], r["rollout_rs_threshold"])

    def resolved(self) -> dict:
        """Every key's value: the one set, else the preset's, else verl's default."""
        preset = PRESETS[self.preset] if self.preset else {}
        defaults = {
            "rollout_is": None,
            "rollout_is_threshold": IS_THRESHOLD,
            "rollout_rs": None,
            "rollout_rs_threshold": None,
            "bypass_mode": False,
        }
        return {
            k: v if (v := getattr(self, k)) is not None else preset.get(k, default) for k, default in defaults.items()
        }

    @property
    def bypass(self) -> bool:
        return self.resolved()["bypass_mode"]
