"""Figures (PNG and PDF) from the tidy tables the rest of the package writes.

Every function takes DataFrames and an output folder, labels its axes and writes each figure
atomically in both formats.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from gmc.io import save_figure  # noqa: E402

METHOD_COLORS = {"grpo": "tab:blue", "tic": "tab:orange", "gmc": "tab:green", "is": "tab:red",
                 "none": "tab:gray", "gspo": "tab:purple", "tis": "tab:brown"}


def _save(fig, out: Path, stem: str) -> list[Path]:
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    for p in paths:
        save_figure(fig, p, dpi=150)
    plt.close(fig)
    return paths


def theory_figures(tables: dict[str, pd.DataFrame], out: Path) -> list[Path]:
    """Bias vs G (log-log, one panel per eps), shortfall vs eps, final reward vs delay."""
    out = Path(out)
    written: list[Path] = []
    fixed = tables["fixed_policy"]
    for variant, title in (("exact_baseline", "exact baseline A = r - J"),
                           ("group_norm", "group-normalised advantages")):
        sub = fixed[fixed["variant"] == variant]
        eps_values = sorted(sub["eps"].unique())
        fig, axes = plt.subplots(1, len(eps_values), figsize=(3.6 * len(eps_values), 3.4),
                                 sharey=True, squeeze=False)
        drifts = sorted(sub["drift"].unique())
        styles = ["-", "--", ":", "-."]
        for ax, eps in zip(axes[0], eps_values):
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
        axes[0][0].set_ylabel("bias norm ||E g - grad J||")
        axes[0][-1].legend(fontsize=7, loc="lower left")
        fig.suptitle(f"Bias of the capped estimators vs group size ({title}); "
                     "triangles: 95% upper bounds where the bias is not resolved", fontsize=9)
        written += _save(fig, out, f"theory_bias_vs_G_{variant}")

    sub = fixed[fixed["variant"] == "exact_baseline"]
    fig, axes = plt.subplots(1, len(sub["drift"].unique()), figsize=(4 * len(sub["drift"].unique()), 3.4),
                             squeeze=False)
    for ax, (drift, grp_d) in zip(axes[0], sub.groupby("drift")):
        for (method, G), grp in grp_d.groupby(["method", "G"]):
            if G not in (min(sub["G"]), max(sub["G"])):
                continue
            grp = grp.sort_values("eps")
            ax.plot(grp["eps"], grp["shortfall"], color=METHOD_COLORS[method],
                    ls="-" if G == max(sub["G"]) else "--", marker="o", ms=3, label=f"{method}, G={G}")
        ax.set_xlabel("eps (cap 1+eps)")
        ax.set_title(f"drift {drift:g}")
    axes[0][0].set_ylabel("shortfall E[(1/G) sum (rho - w)]")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("Shortfall: group-mass capping vs per-trajectory truncation")
    written += _save(fig, out, "theory_shortfall_vs_eps")

    summary = tables["delayed_summary"]
    panels = list(summary.groupby(["eps", "G"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.8 * len(panels), 3.4), sharey=True, squeeze=False)
    for ax, ((eps, G), grp) in zip(axes[0], panels):
        for method, g in grp.groupby("method"):
            g = g.sort_values("delay")
            x = g["delay"].clip(lower=0.5)
            ax.errorbar(x, g["final_reward"], yerr=g["final_reward_std"].fillna(0), color=METHOD_COLORS[method],
                        marker="o", ms=3, capsize=2, label=method)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("delay d (optimizer steps)")
        ax.set_title(f"eps = {eps:g}, G = {G}")
    axes[0][0].set_ylabel("final expected reward")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle("Delayed gradient ascent in the tabular world")
    written += _save(fig, out, "theory_reward_vs_delay")
    return written
