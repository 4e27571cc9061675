"""Gradient lab (method.md section 1, on a language model): the paper's estimator claims measured
on the tiny model's real gradients, at fixed pairs of behaviour and current weights.

A pair is a real trajectory's: the behaviour weights ``theta_H`` end a seed's on-policy history,
the current weights ``theta_{H+d}`` continue it ``d`` on-policy updates (the history's own
settings, in a scratch folder), so the two are ``d`` versions apart as a stale update's are.
On ``prompts`` fixed prompts, for each group size ``G``, ``batches`` independent batches (one
group of ``G`` answers per prompt) are sampled from ``theta_H`` once and shared by every ``d``
and estimator. Each estimator's gradient of one batch is the trainer's own
(:meth:`gmc.policy.update.Update.backward` at ``theta_{H+d}``), kept as one flat vector; the
*target* of an estimator is the on-policy expectation of the same loss at ``theta_{H+d}`` with
groups of ``G`` (every ratio 1), as the theory lab's group-normalised variant defines it, one per
on-policy class (:meth:`gmc.estimators.registry.Estimator.on_policy_class`), from ``batches``
batches sampled from ``theta_{H+d}``. From the two sets of vectors: the bias
``||E g - E g_target||`` (debiased, with its interval: :func:`gmc.theory.lab._bias_norm`, whose
noise includes the target's), the excess over uncapped importance sampling ``||E (g - g_is)||``
(paired on the same batches, for the estimators of ``is``'s class), the cosine of the two
means, the second moment ``E ||g||^2`` and the variance ``tr Cov g``, each estimator's own
statistics and the pair's divergence. Memory: ``batches`` vectors of the model's size per
estimator and cell, never a per-sample gradient.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml
from tqdm import tqdm

from gmc.estimators import REGISTRY
from gmc.io import write_csv, write_json
from gmc.results.outputs import GRADIENT_LAB_TABLES
from gmc.results.stats import t_quantile
from gmc.run.config import TrainConfig
from gmc.settings import (
    ConfigError,
    from_dict,
    load_config,
    to_dict,
)
from gmc.theory.config import GradientLabConfig
from gmc.theory.figures import LAB_CONFIG, lab_report
from gmc.theory.lab import _bias_norm, claim_fits


def continuation_config(history: Path, steps: int) -> TrainConfig:
    """The on-policy run that continues the history in ``history`` for ``steps`` updates: its own
    settings, started from its end (``warmup: history``, ``d = 0``). A history of several updates
    per step is refused: its continuation would step ``updates_per_batch`` versions at a time,
    and the lab's pairs are ``d`` updates apart."""
    from gmc.rollouts.delays import DelayConfig

    path = Path(history) / "config.yaml"
    try:
        saved = yaml.safe_load(path.read_text())
        cfg = from_dict(TrainConfig, saved)
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"--history {history}: its config.yaml cannot be read ({e})") from None
    if cfg.updates_per_batch != 1:
        raise ConfigError(
            f"--history {history}: trained with {cfg.updates_per_batch} updates per step; the gradient lab "
            "pairs weights d updates apart along a history of one update per step",
            "updates_per_batch",
        )
    delay = DelayConfig(mode="fixed", d=0, warmup="history", history_steps=cfg.steps, history_algorithm=cfg.algorithm)
    return dataclasses.replace(cfg, steps=steps, delay=delay, keep_checkpoints="none")


def _flat_gradient(params: Sequence[torch.Tensor]) -> np.ndarray:
    """The parameters' gradient as one float64 vector; the gradients are cleared."""
    out = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in params])
    for p in params:
        p.grad = None
    return out.cpu().numpy()


class _Lab:
    """The trainer of the continuation, its collector and one update per estimator and eps."""

    def __init__(self, history: Path, cfg: GradientLabConfig, scratch: Path, progress: bool):
        from gmc.run.trainer import Trainer

        self.lab = cfg
        self.run = continuation_config(history, max(cfg.delays))
        self.trainer = Trainer(self.run, scratch, history=history, progress=False)
        self.model = self.trainer.model
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.prompts: list = []
        torch.manual_seed(cfg.seed)
        self.progress, self.loaded = progress, None
        self.bar: tqdm | None = None  # the gradients' progress, where measure counts them

    def weights(self) -> dict[int, dict[str, torch.Tensor]]:
        """The weights at the history's end (0) and after each of the lab's delays, on-policy."""
        snap = lambda: {k: v.detach().clone() for k, v in self.model.state_dict().items()}  # noqa: E731
        out = {0: snap()}
        for step in tqdm(
            range(max(self.lab.delays)), desc="gradient lab: continuing the history", disable=not self.progress
        ):
            self.trainer.train_step()
            self.trainer.step += 1
            if step + 1 in self.lab.delays:
                out[step + 1] = snap()
        return out

    def load(self, d: int, weights: dict[int, dict[str, torch.Tensor]]) -> None:
        """The weights ``d`` updates after the history's end."""
        self.model.load_state_dict(weights[d])
        self.loaded = d
        if self.trainer.engine is not None:
            self.trainer.engine.sync_weights(self.model)

    def sample(self, G: int, behaviour: str, prompts: list | None = None) -> list:
        """One batch: a group of ``G`` answers for every prompt (the lab's, or ``prompts``), with
        the current weights."""
        collector = self.trainer.collector
        collector.group_size, collector.behaviour = G, behaviour
        return collector.collect(self.prompts if prompts is None else prompts, version=0).groups

    def choose_prompts(self) -> list[float]:
        """The lab's prompts (:attr:`GradientLabConfig.prompts`), screened with the current
        weights; returns the screening groups' mean rewards of those kept."""
        records, cfg = self.trainer.cursor.records, self.lab
        order = np.random.default_rng([cfg.seed, 1]).permutation(len(records))[: cfg.prompt_pool].tolist()
        kept, rates = [], []
        for start in range(0, len(order), cfg.prompts):
            chunk = [(i, records[i]) for i in order[start : start + cfg.prompts]]
            for prompt, group in zip(chunk, self.sample(cfg.focus_group_size, "none", chunk)):
                rate = float(group.rewards.mean())
                if 0 < rate < 1 and len(kept) < cfg.prompts:
                    kept.append(prompt)
                    rates.append(rate)
            if len(kept) == cfg.prompts:
                self.prompts = kept
                return rates
        raise ValueError(
            f"{len(kept)} of {cfg.prompt_pool} screened prompts have groups of {cfg.focus_group_size} "
            f"answers neither all right nor all wrong, {cfg.prompts} needed: raise prompt_pool or "
            "measure a policy that learns"
        )

    def update(self, algorithm: str, eps: float | None = None):
        from gmc.policy.update import Update

        cfg = (
            self.run
            if eps is None
            else dataclasses.replace(self.run, estimator=dataclasses.replace(self.run.estimator, eps=eps))
        )
        return Update.from_config(
            dataclasses.replace(cfg, algorithm=algorithm), self.model, self.trainer.tokenizer.pad_token_id
        )

    def gradients(self, update, batches: list[list], on_policy: bool) -> tuple[np.ndarray, list[dict]]:
        """Each batch's gradient ``[batches, parameters]`` and statistics."""
        grads, stats = [], []
        for groups in batches:
            _, st, _ = update.backward(groups, on_policy)
            grads.append(_flat_gradient(self.params))
            stats.append(st)
            if self.bar is not None:
                self.bar.update(1)
        return np.stack(grads), stats

    def close(self) -> None:
        self.trainer.close()


def _class_of(algorithm: str, cfg: TrainConfig):
    estimator = REGISTRY[algorithm]
    return estimator.on_policy_class(estimator.resolved(cfg.estimator))


def _moments(g: np.ndarray) -> dict[str, float]:
    """Second moment ``E||g||^2`` with its standard error, and the variance ``tr Cov g``."""
    sq = np.einsum("ij,ij->i", g, g)
    mean = g.mean(0)
    return {
        "second_moment": float(sq.mean()),
        "second_moment_se": float(sq.std(ddof=1) / math.sqrt(len(sq))),
        "variance": float((sq.sum() - len(g) * mean @ mean) / (len(g) - 1)),
    }


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else float("nan")


def _row(g: np.ndarray, target: np.ndarray, reference: np.ndarray | None, stats: list[dict]) -> dict:
    """One cell's measures of the batch gradients ``g`` against the target's and (same class) ``is``'s."""
    bias = _bias_norm(g, target)
    excess = _bias_norm(g - reference) if reference is not None else (math.nan,) * 4
    target_mean = target.mean(0)
    target_norm = float(np.linalg.norm(target_mean))  # 0 where no on-policy group had two rewards
    keys = sorted({k for s in stats for k in s if k.startswith("ratio/")})
    return dict(
        bias=bias[0],
        bias_lo=bias[1],
        bias_hi=bias[2],
        bias_se=bias[3],
        excess=excess[0],
        excess_lo=excess[1],
        excess_hi=excess[2],
        excess_se=excess[3],
        rel_bias=bias[0] / target_norm if target_norm > 0 else math.nan,
        cosine=_cosine(g.mean(0), target_mean),
        **_moments(g),
        target_norm=target_norm,
        target_second_moment=_moments(target)["second_moment"],
        **{k: float(np.mean([s[k] for s in stats if k in s])) for k in keys},
    )


def measure(history: Path, cfg: GradientLabConfig, progress: bool = True) -> dict[str, pd.DataFrame]:
    """Every (d, G, eps, estimator) row of the lab, the pairs' divergence, and the claims fitted
    on them (:func:`lab_claims`)."""
    algorithms = list(dict.fromkeys([*cfg.algorithms, "is"]))
    every = [*algorithms, *cfg.league_algorithms()]
    focus = (max(cfg.delays), cfg.focus_group_size)
    plan = [
        (
            d,
            G,
            [(a, None) for a in algorithms]
            + (
                [(a, None) for a in cfg.league_algorithms()] + [(a, e) for a in ("tic", "gmc") for e in cfg.eps_values]
                if (d, G) == focus
                else []
            ),
        )
        for d in [*cfg.delays]
        for G in sorted({*cfg.group_sizes, cfg.focus_group_size})
        if G in cfg.group_sizes or (d, G) == focus
    ]
    with tempfile.TemporaryDirectory(prefix="gradient-lab-") as scratch:
        lab = _Lab(history, cfg, Path(scratch) / "continuation", progress)
        try:
            weights = lab.weights()
            classes = {a: _class_of(a, lab.run) or a for a in every}  # no class: its own target
            n = cfg.batches
            lab.bar = tqdm(
                total=sum(n * (len(ests) + len({classes[a] for a, _ in ests})) for _, _, ests in plan),
                desc="gradient lab: gradients",
                unit="batch",
                disable=not progress,
            )
            lab.load(0, weights)
            screened = lab.choose_prompts()
            behaviour = {
                G: [lab.sample(G, lab.run.behaviour_logprobs) for _ in range(n)]
                for G in tqdm(
                    sorted({G for _, G, _ in plan}), desc="gradient lab: behaviour samples", disable=not progress
                )
            }
            rows, pairs, squares = [], [], {}
            for d, G, ests in plan:
                if d != lab.loaded:
                    lab.load(d, weights)
                on_policy = [lab.sample(G, "none") for _ in range(n)]
                targets = {}
                for a, _ in ests:
                    if classes[a] not in targets:
                        targets[classes[a]], _ = lab.gradients(lab.update(a), on_policy, True)
                g_is, is_stats = lab.gradients(lab.update("is"), behaviour[G], False)
                pairs.append(
                    dict(delay=d, G=G, **{k: float(np.mean([s[f"ratio/{k}"] for s in is_stats])) for k in PAIR_STATS})
                )
                for a, e in ests:
                    g, stats = (
                        (g_is, is_stats)
                        if (a, e) == ("is", None)
                        else lab.gradients(lab.update(a, e), behaviour[G], False)
                    )
                    same = classes[a] == classes["is"]
                    eps = lab.run.estimator.eps if e is None else e
                    if e is None:
                        squares[(d, G, a)] = np.einsum("ij,ij->i", g, g)
                    rows.append(
                        dict(
                            delay=d,
                            G=G,
                            eps=eps,
                            algorithm=a,
                            eps_row=e is not None,
                            n=n,
                            **_row(g, targets[classes[a]], g_is if same else None, stats),
                        )
                    )
            lab.bar.close()
        finally:
            lab.close()
    gradients, pairs = pd.DataFrame(rows), pd.DataFrame(pairs)
    gradients["rho_max_dev"] = gradients["delay"].map(np.expm1(pairs.groupby("delay")["log_ratio_max"].max()))
    prompts = pd.DataFrame({"prompt_index": [i for i, _ in lab.prompts], "screened_reward": screened})
    return {"gradients": gradients, "pairs": pairs, "claims": lab_claims(gradients, squares), "prompts": prompts}


PAIR_STATS = ("log_ratio_mean", "log_ratio_min", "log_ratio_max", "approx_kl", "ess_frac")
"""The pair's divergence on the behaviour samples (``is``'s statistics): the trajectory log-ratio
``L`` (mean, extremes), the k3 estimate of KL per token, and uncapped IS's ESS / G."""


def paired_ratio(x: np.ndarray, y: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """``mean(x) / mean(y)`` of paired samples with its delta-method interval
    (``se = sd(x - R y) / (sqrt(n) mean(y))``)."""
    if y.mean() == 0:  # no gradient in any batch (every group's rewards equal)
        return math.nan, math.nan, math.nan
    R = float(x.mean() / y.mean())
    se = float((x - R * y).std(ddof=1) / (math.sqrt(len(x)) * y.mean()))
    half = t_quantile(len(x) - 1, level) * se
    return R, R - half, R + half


def lab_claims(gradients: pd.DataFrame, squares: dict[tuple, np.ndarray]) -> pd.DataFrame:
    """The paper's claims on the lab's rows, per delay, for ``tic`` and ``gmc``: the exponent of
    the excess over ``is`` in G at the history's eps (claims 2-3) and in eps over the eps rows
    (claim 1), fitted as the theory lab fits them (:func:`gmc.theory.lab.claim_fits`); and
    ``gmc``'s second moment over ``tic``'s on the same batches per delay and G at the history's eps
    (:func:`paired_ratio` of the batches' squared norms ``squares``, keyed ``(d, G, algorithm)``):
    the second-moment guarantee the class shares holds where it stays near 1."""
    capped = gradients[gradients["algorithm"].isin(["tic", "gmc"])].assign(variant="language_model")
    fits = [claim_fits(capped[~capped["eps_row"]], pair="delay", claims=("2/3",))]
    if capped["eps_row"].any():
        fits.append(claim_fits(capped[capped["eps_row"]], pair="delay", claims=("1",)))
    moments = []
    for d, G in sorted({(d, G) for d, G, _ in squares}):
        if (d, G, "tic") in squares and (d, G, "gmc") in squares:
            R, lo, hi = paired_ratio(squares[(d, G, "gmc")], squares[(d, G, "tic")])
            moments.append(
                dict(
                    claim="second moment",
                    x="G",
                    variant="language_model",
                    delay=d,
                    at=f"G={G:g}",
                    algorithm="gmc / tic",
                    exponent=R,
                    lo=lo,
                    hi=hi,
                    n_points=len(squares[(d, G, "gmc")]),
                    reference=1.0,
                    covers_reference=bool(lo <= 1 <= hi),
                )
            )
    return pd.concat([*fits, pd.DataFrame(moments)], ignore_index=True)


# ---------------------------------------------------------------------------------------------
# files, figures, entry point


def run_gradient_lab(
    history: str | Path, out: str | Path, cfg: GradientLabConfig, progress: bool = True
) -> dict[str, pd.DataFrame]:
    """Measure (:func:`measure`) and write the tables, their Markdown and the figures under ``out``."""
    history, out = Path(history), Path(out)
    if not (history / "summary.json").exists():
        raise ConfigError(f"--history {history}: not a finished history (no summary.json); make it with gmc history")
    start = time.time()
    tables = measure(history, cfg, progress)
    for name in GRADIENT_LAB_TABLES:
        write_csv(tables[name], out / f"{name}.csv")
    write_json(out / LAB_CONFIG, {**to_dict(cfg), "history": str(history), "seconds": round(time.time() - start, 1)})
    lab_report(out)
    return tables


def run_from_args(args: argparse.Namespace) -> None:
    cfg = load_config(GradientLabConfig, args.config, args.overrides)
    tables = run_gradient_lab(args.history, args.out, cfg)
    print(tables["claims"].to_string(index=False))
