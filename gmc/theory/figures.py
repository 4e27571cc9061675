"""The theory lab's figures (:mod:`gmc.theory.lab`, method.md section 1): bias against the group
size and the cap, shortfall, and delayed gradient ascent, from the lab's tidy tables.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.ticker
import pandas as pd

from gmc.results.figures import ALGORITHM_COLORS, panel_row, save_both, spread


def theory_figures(tables: dict[str, pd.DataFrame], out: Path) -> list[Path]:
    """Bias vs G (log-log, one panel per eps), the cap's bias vs eps, shortfall vs eps, final
    reward vs delay."""
    out = Path(out)
    written: list[Path] = []
    fixed = tables["fixed_policy"]
    for variant, title in (("exact_baseline", "exact baseline A = r - J"),
                           ("group_norm", "group-normalised advantages; is: the uncapped reference")):
        sub = fixed[fixed["variant"] == variant]
        eps_values = spread(sorted(sub["eps"].unique()))
        fig, axes = panel_row(len(eps_values), 3.6, sharey=True)
        drifts = sorted(sub["drift"].unique())
        styles = ["-", "--", ":", "-."]
        for ax, eps in zip(axes, eps_values):
            for (algorithm, drift), grp in sub[sub["eps"] == eps].groupby(["algorithm", "drift"]):
                grp = grp.sort_values("G")
                ok = grp[grp["bias_lo"] > 0]  # resolved: the 95% interval excludes 0
                color, ls = ALGORITHM_COLORS[algorithm], styles[drifts.index(drift) % 4]
                ax.errorbar(ok["G"], ok["bias"], yerr=[ok["bias"] - ok["bias_lo"], ok["bias_hi"] - ok["bias"]],
                            color=color, ls=ls, marker="o", ms=3, capsize=2, label=f"{algorithm}, drift {drift:g}")
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
        written += save_both(fig, out, f"theory_bias_vs_G_{variant}")

    claims = tables["claims"]
    sub = fixed[(fixed["variant"] == "exact_baseline") & (fixed["algorithm"] != "is")]
    group_sizes = spread(sorted(sub["G"].unique()), 3)
    fig, axes = panel_row(len(sub["drift"].unique()), 3.6, sharey=True)
    for ax, (drift, grp_d) in zip(axes, sub.groupby("drift")):
        for (algorithm, G), grp in grp_d[grp_d["G"].isin(group_sizes)].groupby(["algorithm", "G"]):
            grp = grp.sort_values("eps")
            ok = grp[grp["excess_lo"] > 0]
            fit = claims[(claims["claim"] == "1") & (claims["variant"] == "exact_baseline")
                         & (claims["drift"] == drift) & (claims["algorithm"] == algorithm) & (claims["at"] == f"G={G:g}")]
            k = fit.iloc[0] if len(fit) else None
            label = f"{algorithm}, G={G}" + (f": {k.exponent:.2f} [{k.lo:.2f}, {k.hi:.2f}]"
                                          if k is not None and pd.notna(k.exponent) else "")
            ax.errorbar(ok["eps"], ok["excess"], yerr=[ok["excess"] - ok["excess_lo"], ok["excess_hi"] - ok["excess"]],
                        color=ALGORITHM_COLORS[algorithm], ls=["-", "--", ":"][group_sizes.index(G)], marker="o", ms=3,
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
    written += save_both(fig, out, "theory_bias_vs_eps")

    sub = fixed[(fixed["variant"] == "exact_baseline") & (fixed["algorithm"] != "is")]
    fig, axes = panel_row(len(sub["drift"].unique()), 4)
    for ax, (drift, grp_d) in zip(axes, sub.groupby("drift")):
        for (algorithm, G), grp in grp_d.groupby(["algorithm", "G"]):
            if G not in (min(sub["G"]), max(sub["G"])):
                continue
            grp = grp.sort_values("eps")
            ax.plot(grp["eps"], grp["shortfall"], color=ALGORITHM_COLORS[algorithm],
                    ls="-" if G == max(sub["G"]) else "--", marker="o", ms=3, label=f"{algorithm}, G={G}")
        ax.set_xlabel("eps (cap 1+eps)")
        ax.set_title(f"drift {drift:g}")
    axes[0].set_ylabel("shortfall E[(1/G) sum (rho - w)]")
    axes[-1].legend(fontsize=7)
    fig.suptitle("Shortfall: group-mass capping vs per-trajectory truncation")
    written += save_both(fig, out, "theory_shortfall_vs_eps")

    summary = tables["delayed_summary"]
    panels = list(summary.groupby(["eps", "G"]))
    fig, axes = panel_row(len(panels), 3.8, sharey=True)
    for ax, ((eps, G), grp) in zip(axes, panels):
        for algorithm, g in grp.groupby("algorithm"):
            g = g.sort_values("delay")
            yerr = [(g["final_reward"] - g["final_reward_lo"]).fillna(0), (g["final_reward_hi"] - g["final_reward"]).fillna(0)]
            ax.errorbar(g["delay"], g["final_reward"], yerr=yerr, color=ALGORITHM_COLORS[algorithm],
                        marker="o", ms=3, capsize=2, label=algorithm)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("delay d (steps)")
        ax.set_title(f"eps = {eps:g}, G = {G}")
    axes[0].set_ylabel("final expected reward")
    axes[-1].legend(fontsize=8)
    fig.suptitle("Delayed gradient ascent in the tabular world; bars: 95% interval over seeds")
    written += save_both(fig, out, "theory_reward_vs_delay")
    return written
