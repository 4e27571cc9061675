"""Figures (PNG and PDF) from the tidy tables the rest of the package writes.

Every function takes DataFrames and an output folder, labels its axes and writes each figure
atomically in both formats.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from gmc.analysis import delay_order, delay_title  # noqa: E402
from gmc.estimators import REGISTRY  # noqa: E402
from gmc.io import save_figure  # noqa: E402
from gmc.stats import mean_interval  # noqa: E402

METHOD_COLORS = {name: e.color for name, e in REGISTRY.items()}


def method_label(name: str) -> str:
    """An estimator's legend label (its registry label; the name itself if unregistered)."""
    return REGISTRY[name].label if name in REGISTRY else name


def _row(n: int, width: float = 4.0, sharey: bool = False):
    """A figure with ``n`` panels side by side; returns ``(fig, axes)``."""
    fig, axes = plt.subplots(1, n, figsize=(width * n, 3.6), sharey=sharey, squeeze=False, layout="constrained")
    return fig, axes[0]


def _save(fig, out: Path, stem: str) -> list[Path]:
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    for p in paths:
        save_figure(fig, p, dpi=150)
    plt.close(fig)
    return paths


def _spread(values: list, k: int = 4) -> list:
    """At most ``k`` values spread over ``values`` (first and last included)."""
    if len(values) <= k:
        return list(values)
    return [values[i] for i in sorted({round(j * (len(values) - 1) / (k - 1)) for j in range(k)})]


def theory_figures(tables: dict[str, pd.DataFrame], out: Path) -> list[Path]:
    """Bias vs G (log-log, one panel per eps), the cap's bias vs eps, shortfall vs eps, final
    reward vs delay."""
    out = Path(out)
    written: list[Path] = []
    fixed = tables["fixed_policy"]
    for variant, title in (("exact_baseline", "exact baseline A = r - J"),
                           ("group_norm", "group-normalised advantages; is: the uncapped reference")):
        sub = fixed[fixed["variant"] == variant]
        eps_values = _spread(sorted(sub["eps"].unique()))
        fig, axes = _row(len(eps_values), 3.6, sharey=True)
        drifts = sorted(sub["drift"].unique())
        styles = ["-", "--", ":", "-."]
        for ax, eps in zip(axes, eps_values):
            for (method, drift), grp in sub[sub["eps"] == eps].groupby(["method", "drift"]):
                grp = grp.sort_values("G")
                ok = grp[grp["bias_lo"] > 0]  # resolved: the 95% interval excludes 0
                color, ls = METHOD_COLORS[method], styles[drifts.index(drift) % 4]
                ax.errorbar(ok["G"], ok["bias"], yerr=[ok["bias"] - ok["bias_lo"], ok["bias_hi"] - ok["bias"]],
                            color=color, ls=ls, marker="o", ms=3, capsize=2, label=f"{method}, drift {drift:g}")
                upper = grp[(grp["bias_lo"] <= 0) & (grp["bias_hi"] > 0)]
                ax.scatter(upper["G"], upper["bias_hi"], color=color, marker="v", s=14)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"eps = {eps:g}")
            ax.set_xlabel("group size G")
        axes[0].set_ylabel("bias norm ||E g - target||")
        axes[-1].legend(fontsize=6, loc="lower left")
        fig.suptitle(f"Bias of the capped estimators vs group size ({title}); "
                     "triangles: 95% upper bounds where the bias is not resolved", fontsize=9)
        written += _save(fig, out, f"theory_bias_vs_G_{variant}")

    claims = tables["claims"]
    sub = fixed[(fixed["variant"] == "exact_baseline") & (fixed["method"] != "is")]
    group_sizes = _spread(sorted(sub["G"].unique()), 3)
    fig, axes = _row(len(sub["drift"].unique()), 3.6, sharey=True)
    for ax, (drift, grp_d) in zip(axes, sub.groupby("drift")):
        for (method, G), grp in grp_d[grp_d["G"].isin(group_sizes)].groupby(["method", "G"]):
            grp = grp.sort_values("eps")
            ok = grp[grp["excess_lo"] > 0]
            fit = claims[(claims["claim"] == "1") & (claims["variant"] == "exact_baseline")
                         & (claims["drift"] == drift) & (claims["method"] == method) & (claims["at"] == f"G={G:g}")]
            k = fit.iloc[0] if len(fit) else None
            label = f"{method}, G={G}" + (f": {k.exponent:.2f} [{k.lo:.2f}, {k.hi:.2f}]"
                                          if k is not None and pd.notna(k.exponent) else "")
            ax.errorbar(ok["eps"], ok["excess"], yerr=[ok["excess"] - ok["excess_lo"], ok["excess_hi"] - ok["excess"]],
                        color=METHOD_COLORS[method], ls=["-", "--", ":"][group_sizes.index(G)], marker="o", ms=3,
                        capsize=2, label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("eps (cap 1+eps)")
        ax.set_title(f"drift {drift:g} (max |rho-1| = {grp_d['rho_max_dev'].iloc[0]:.2g})", fontsize=9)
    axes[0].set_ylabel("bias of the cap ||E g - grad J||")
    for ax in axes:
        ax.legend(fontsize=6, loc="lower left")
    fig.suptitle("Claim 1: the cap's bias against eps (exact baseline); legend: fitted exponent, 95% interval",
                 fontsize=9)
    written += _save(fig, out, "theory_bias_vs_eps")

    sub = fixed[(fixed["variant"] == "exact_baseline") & (fixed["method"] != "is")]
    fig, axes = _row(len(sub["drift"].unique()), 4)
    for ax, (drift, grp_d) in zip(axes, sub.groupby("drift")):
        for (method, G), grp in grp_d.groupby(["method", "G"]):
            if G not in (min(sub["G"]), max(sub["G"])):
                continue
            grp = grp.sort_values("eps")
            ax.plot(grp["eps"], grp["shortfall"], color=METHOD_COLORS[method],
                    ls="-" if G == max(sub["G"]) else "--", marker="o", ms=3, label=f"{method}, G={G}")
        ax.set_xlabel("eps (cap 1+eps)")
        ax.set_title(f"drift {drift:g}")
    axes[0].set_ylabel("shortfall E[(1/G) sum (rho - w)]")
    axes[-1].legend(fontsize=7)
    fig.suptitle("Shortfall: group-mass capping vs per-trajectory truncation")
    written += _save(fig, out, "theory_shortfall_vs_eps")

    summary = tables["delayed_summary"]
    panels = list(summary.groupby(["eps", "G"]))
    fig, axes = _row(len(panels), 3.8, sharey=True)
    for ax, ((eps, G), grp) in zip(axes, panels):
        for method, g in grp.groupby("method"):
            g = g.sort_values("delay")
            yerr = [(g["final_reward"] - g["final_reward_lo"]).fillna(0), (g["final_reward_hi"] - g["final_reward"]).fillna(0)]
            ax.errorbar(g["delay"], g["final_reward"], yerr=yerr, color=METHOD_COLORS[method],
                        marker="o", ms=3, capsize=2, label=method)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("delay d (optimizer steps)")
        ax.set_title(f"eps = {eps:g}, G = {G}")
    axes[0].set_ylabel("final expected reward")
    axes[-1].legend(fontsize=8)
    fig.suptitle("Delayed gradient ascent in the tabular world; bars: 95% interval over seeds")
    written += _save(fig, out, "theory_reward_vs_delay")
    return written


# ---------------------------------------------------------------------------------------------
# figures of a sweep


def _numeric_delays(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame[frame["delay"].str.isdigit()].copy()
    out["delay"] = out["delay"].astype(int)
    return out


def _score_column(frame: pd.DataFrame) -> tuple[str, str]:
    """The headline score: mean Pass@1 over benchmarks when evaluated, else final train reward.

    Adds ``score`` and its evaluation standard error ``score_se`` (0 for the train reward) to ``frame``."""
    from gmc.analysis import FINAL_REWARD, SE, benchmarks_in, with_benchmark_means

    benches = benchmarks_in(frame)
    means = with_benchmark_means(frame)
    if "eval/mean/pass_at_1" in means.columns:
        frame["score"] = means["eval/mean/pass_at_1"]
        frame["score_se"] = means[f"eval/mean/pass_at_1{SE}"]
        return "score", f"Pass@1 (mean over {', '.join(benches)})"
    frame["score"] = frame[FINAL_REWARD]
    frame["score_se"] = 0.0
    return "score", "final training reward (last 20 steps)"


def _line_by_algorithm(ax, frame, x, y, se=None):
    """Mean over seeds per ``x``, one line per algorithm, error bars = 95% interval
    (:func:`gmc.stats.mean_interval`, evaluation noise ``se`` folded in; none with one seed)."""
    for algo, grp in frame.groupby("algorithm"):
        points = []
        for xv, g in grp.groupby(x):
            iv = mean_interval(g[y], g[se] if se else None)
            points.append((xv, iv.mean, 0.0 if pd.isna(iv.half) else iv.half))
        xs, ms, hs = zip(*sorted(points))
        ax.errorbar(xs, ms, yerr=hs, marker="o", ms=4, capsize=2, color=METHOD_COLORS.get(algo), label=method_label(algo))


def run_figures(results: str | Path, out: str | Path | None = None) -> list[Path]:
    """Every figure of a sweep, from its run directories (no training, no evaluation)."""
    import numpy as np

    from gmc.analysis import collect
    from gmc.io import read_jsonl

    results = Path(results)
    out = Path(out or results / "figures")
    frame = collect(results)
    written: list[Path] = []

    # 1. training reward vs step, one panel per delay, one line per algorithm (largest group size)
    G = int(frame["group"].max())
    sub = frame[frame["group"] == G]
    delays = sorted(sub["delay"].unique(), key=delay_order)
    fig, axes = _row(len(delays), 4, sharey=True)
    for ax, delay in zip(axes, delays):
        for algo, grp in sub[sub["delay"] == delay].groupby("algorithm"):
            curves = pd.concat([pd.Series([r.get("rollout/reward_mean", np.nan)
                                           for r in read_jsonl(Path(d) / "metrics.jsonl")]).rolling(10, min_periods=1).mean()
                                for d in grp["run_dir"]], axis=1)  # [step, seed]
            band = [mean_interval(row) for row in curves.to_numpy()]
            mean = np.array([iv.mean for iv in band])
            ax.plot(curves.index, mean, color=METHOD_COLORS.get(algo), label=f"{method_label(algo)} (n = {curves.shape[1]})")
            if curves.shape[1] > 1:
                ax.fill_between(curves.index, [iv.lo for iv in band], [iv.hi for iv in band],
                                color=METHOD_COLORS.get(algo), alpha=0.2, lw=0)
        ax.set_title(delay_title(delay))
        ax.set_xlabel("optimizer step")
    axes[0].set_ylabel("rollout reward (10-step mean)")
    axes[-1].legend()
    fig.suptitle(f"Training reward of fresh rollouts, G = {G}; bands: 95% interval over seeds")
    written += _save(fig, out, "reward_vs_step")

    # 2. final score vs delay, one panel per group size
    frame = frame.copy()
    score, score_label = _score_column(frame)
    numeric = _numeric_delays(frame)
    groups = sorted(frame["group"].unique())
    fig, axes = _row(len(groups), 4, sharey=True)
    for ax, g in zip(axes, groups):
        _line_by_algorithm(ax, numeric[numeric["group"] == g], "delay", score, "score_se")
        lat = frame[~frame["delay"].str.isdigit() & (frame["group"] == g)]
        for algo, grp in lat.groupby("algorithm"):
            ax.axhline(grp[score].mean(), color=METHOD_COLORS.get(algo), ls=":", lw=1)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlim(-0.5, 1.5 * max(numeric["delay"].max(), 1))
        ax.set_xlabel("delay d (optimizer steps)")
        named = ", ".join(delay_title(d) for d in sorted(lat["delay"].unique(), key=delay_order))
        ax.set_title(f"G = {g}" + (f" (dotted: {named})" if len(lat) else ""))
    axes[0].set_ylabel(score_label)
    axes[-1].legend()
    fig.suptitle("Final score vs delay; bars: 95% interval over seeds")
    written += _save(fig, out, "score_vs_delay")

    # 3. final score vs group size, one panel per delay
    fig, axes = _row(len(delays), 4, sharey=True)
    for ax, delay in zip(axes, delays):
        _line_by_algorithm(ax, frame[frame["delay"] == delay], "group", score, "score_se")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("group size G")
        ax.set_title(delay_title(delay))
    axes[0].set_ylabel(score_label)
    axes[-1].legend()
    fig.suptitle("Final score vs group size; bars: 95% interval over seeds")
    written += _save(fig, out, "score_vs_group")

    # 4. ratio diagnostics vs delay
    panels = [("capped", "fraction capped / clipped"), ("ratio/ess_frac", "ESS / G"),
              ("ratio/shortfall", "shortfall sum(rho - w) / sum(rho)")]
    numeric = numeric.copy()
    own = dict.fromkeys(d for e in REGISTRY.values() for d in e.diagnostics)  # each estimator's clip statistic
    capped_cols = [c for c in own if c in numeric.columns]
    numeric["capped"] = numeric[capped_cols].bfill(axis=1).iloc[:, 0] if capped_cols else np.nan
    fig, axes = _row(3)
    for ax, (col, label) in zip(axes, panels):
        if col in numeric.columns:
            _line_by_algorithm(ax, numeric[numeric["group"] == G], "delay", col)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlim(-0.5, 1.5 * max(numeric["delay"].max(), 1))
        ax.set_xlabel("delay d")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Ratio diagnostics vs delay (G = {G}; capped: each estimator's own fraction, "
                 f"{', '.join(capped_cols)})")
    written += _save(fig, out, "ratio_diagnostics")

    # 5. staleness vs response length under the latency model
    fig, ax = plt.subplots(figsize=(5, 3.6), layout="constrained")
    lat = frame[~frame["delay"].str.isdigit()]
    for algo, grp in lat.groupby("algorithm"):
        rows = [r for d in grp["run_dir"] for r in read_jsonl(Path(d) / "groups.jsonl")]
        gdf = pd.DataFrame(rows)
        bins = pd.cut(gdf["length_max"], bins=8)
        stats = gdf.groupby(bins, observed=True)["staleness"].mean()
        centers = [b.mid for b in stats.index]
        ax.plot(centers, stats.values, marker="o", color=METHOD_COLORS.get(algo), label=method_label(algo))
    if lat.empty:
        ax.text(0.5, 0.5, "no runs of a named delay model in this sweep", ha="center", va="center",
                transform=ax.transAxes)
    else:
        ax.legend()
    ax.set_xlabel("longest response in the group (tokens)")
    ax.set_ylabel("mean staleness (optimizer steps)")
    ax.set_title("Latency model: long answers arrive staler")
    written += _save(fig, out, "staleness_vs_length")
    return written
