"""The theory lab's figures (:mod:`gmc.theory.lab`, method.md section 1): bias against the group
size and the cap, shortfall, and delayed gradient ascent, from the lab's tidy tables; and the
gradient lab's (:mod:`gmc.theory.gradients`) Markdown and figures, redrawn from its tables alone.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.collections
import matplotlib.ticker
import numpy as np
import pandas as pd

from gmc.io import write_text
from gmc.results.figures import ALGORITHM_COLORS, LEGEND_INSIDE, algorithm_styles, panel_row, save_both, spread
from gmc.results.outputs import GRADIENT_LAB_TABLES
from gmc.results.stats import MIN_FIT_POINTS

MARKERS = (
    "dots and bars: the estimate and its 95% interval over batches where it excludes 0; ▼: its upper bound where not"
)
"""How the figures of :func:`_errorbar` draw a value, said on each of them."""


def _errorbar(ax, grp, x: str, y: str, **kwargs) -> None:
    """``y`` against ``x`` where resolved (its 95% interval excludes 0), with its interval; a
    triangle at the upper bound where not (both labs' bias figures)."""
    ok = grp[grp[f"{y}_lo"] > 0]
    ax.errorbar(
        ok[x], ok[y], yerr=[ok[y] - ok[f"{y}_lo"], ok[f"{y}_hi"] - ok[y]], marker="o", ms=3, capsize=2, **kwargs
    )
    upper = grp[(grp[f"{y}_lo"] <= 0) & (grp[f"{y}_hi"] > 0)]
    ax.scatter(upper[x], upper[f"{y}_hi"], marker="v", s=14, color=kwargs.get("color"))


def theory_figures(tables: dict[str, pd.DataFrame], out: Path) -> list[Path]:
    """Bias vs G (log-log, one panel per eps), the cap's bias vs eps, shortfall vs eps, final
    reward vs delay."""
    out = Path(out)
    written: list[Path] = []
    fixed = tables["fixed_policy"]
    for variant, title in (
        ("exact_baseline", "exact baseline A = r - J"),
        ("group_norm", "group-normalised advantages; is: the uncapped reference"),
    ):
        sub = fixed[fixed["variant"] == variant]
        eps_values = spread(sorted(sub["eps"].unique()))
        fig, axes = panel_row(len(eps_values), 3.6, sharey=True)
        drifts = sorted(sub["drift"].unique())
        styles = ["-", "--", ":", "-."]
        for ax, eps in zip(axes, eps_values):
            for (algorithm, drift), grp in sub[sub["eps"] == eps].groupby(["algorithm", "drift"]):
                _errorbar(
                    ax,
                    grp.sort_values("G"),
                    "G",
                    "bias",
                    color=ALGORITHM_COLORS[algorithm],
                    ls=styles[drifts.index(drift) % 4],
                    label=f"{algorithm}, drift {drift:g}",
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"eps = {eps:g}")
            ax.set_xlabel("group size G")
        axes[0].set_ylabel("bias norm ||E g - target||")
        axes[-1].legend(fontsize=6, loc="lower left")
        fig.suptitle(
            f"Bias of the capped estimators vs group size ({title}); "
            "triangles: 95% upper bounds where the bias is not resolved",
            fontsize=9,
        )
        written += save_both(fig, out, f"theory_bias_vs_G_{variant}")

    claims = tables["claims"]
    sub = fixed[(fixed["variant"] == "exact_baseline") & (fixed["algorithm"] != "is")]
    group_sizes = spread(sorted(sub["G"].unique()), 3)
    fig, axes = panel_row(len(sub["drift"].unique()), 3.6, sharey=True)
    for ax, (drift, grp_d) in zip(axes, sub.groupby("drift")):
        for (algorithm, G), grp in grp_d[grp_d["G"].isin(group_sizes)].groupby(["algorithm", "G"]):
            grp = grp.sort_values("eps")
            ok = grp[grp["excess_lo"] > 0]
            fit = claims[
                (claims["claim"] == "1")
                & (claims["variant"] == "exact_baseline")
                & (claims["drift"] == drift)
                & (claims["algorithm"] == algorithm)
                & (claims["at"] == f"G={G:g}")
            ]
            k = fit.iloc[0] if len(fit) else None
            label = f"{algorithm}, G={G}" + (
                f": {k.exponent:.2f} [{k.lo:.2f}, {k.hi:.2f}]" if k is not None and pd.notna(k.exponent) else ""
            )
            ax.errorbar(
                ok["eps"],
                ok["excess"],
                yerr=[ok["excess"] - ok["excess_lo"], ok["excess_hi"] - ok["excess"]],
                color=ALGORITHM_COLORS[algorithm],
                ls=["-", "--", ":"][group_sizes.index(G)],
                marker="o",
                ms=3,
                capsize=2,
                label=label,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("eps (cap 1+eps)")
        ax.set_title(f"drift {drift:g} (max |rho-1| = {grp_d['rho_max_dev'].iloc[0]:.2g})", fontsize=9)
    axes[0].set_ylabel("bias of the cap ||E g - grad J||")
    for ax in axes:
        ax.legend(fontsize=6, loc="lower left")
    fig.suptitle(
        "Claim 1: the cap's bias against eps (exact baseline); legend: fitted exponent, 95% interval", fontsize=9
    )
    written += save_both(fig, out, "theory_bias_vs_eps")

    sub = fixed[(fixed["variant"] == "exact_baseline") & (fixed["algorithm"] != "is")]
    fig, axes = panel_row(len(sub["drift"].unique()), 4)
    for ax, (drift, grp_d) in zip(axes, sub.groupby("drift")):
        for (algorithm, G), grp in grp_d.groupby(["algorithm", "G"]):
            if G not in (min(sub["G"]), max(sub["G"])):
                continue
            grp = grp.sort_values("eps")
            ax.plot(
                grp["eps"],
                grp["shortfall"],
                color=ALGORITHM_COLORS[algorithm],
                ls="-" if G == max(sub["G"]) else "--",
                marker="o",
                ms=3,
                label=f"{algorithm}, G={G}",
            )
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
            yerr = [
                (g["final_reward"] - g["final_reward_lo"]).fillna(0),
                (g["final_reward_hi"] - g["final_reward"]).fillna(0),
            ]
            ax.errorbar(
                g["delay"],
                g["final_reward"],
                yerr=yerr,
                color=ALGORITHM_COLORS[algorithm],
                marker="o",
                ms=3,
                capsize=2,
                label=algorithm,
            )
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("delay d (steps)")
        ax.set_title(f"eps = {eps:g}, G = {G}")
    axes[0].set_ylabel("final expected reward")
    axes[-1].legend(fontsize=8)
    fig.suptitle("Delayed gradient ascent in the tabular world; bars: 95% interval over seeds")
    written += save_both(fig, out, "theory_reward_vs_delay")
    return written


# ---------------------------------------------------------------------------------------------
# the gradient lab

LAB_SUMMARY = "gradient_lab.md"
"""The lab's tables in Markdown (:func:`lab_report`)."""
LAB_CONFIG = "gradient_lab_config.json"
"""The lab's settings, the history it measured and its time."""


def _log_axes(ax, x_base: int = 10) -> None:
    """Log axes where something positive is drawn; else a note that nothing is (a cap that never
    binds has no excess to draw)."""
    drawn = [
        *(line.get_ydata() for line in ax.get_lines()),
        *(c.get_offsets()[:, 1] for c in ax.collections if isinstance(c, matplotlib.collections.PathCollection)),
    ]
    if any(len(y) and (np.asarray(y, dtype=float) > 0).any() for y in drawn):
        ax.set_xscale("log", base=x_base)
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "nothing above 0", transform=ax.transAxes, ha="center", fontsize=8)


def lab_figures(tables: dict[str, pd.DataFrame], out: Path) -> list[Path]:
    """Bias against G per delay (every estimator), the excess over ``is`` against G (``tic``,
    ``gmc``, ``none``) and against eps."""
    rows, claims = tables["gradients"], tables["claims"]
    main = rows[~rows["eps_row"]]
    written = []
    delays = sorted(main["delay"].unique())
    styles = algorithm_styles(main)  # a league's estimators in colours and line styles of their own
    fig, axes = panel_row(len(delays), 3.8, sharey=True)
    for ax, d in zip(axes, delays):
        for algorithm, grp in main[main["delay"] == d].groupby("algorithm", sort=False):
            _errorbar(
                ax,
                grp.sort_values("G"),
                "G",
                "bias",
                color=styles[algorithm]["color"],
                ls=styles[algorithm]["ls"],
                label=algorithm,
                lw=2 if algorithm in ("tic", "gmc") else 0.8,
            )
        _log_axes(ax, 2)
        ax.set_xlabel("group size G")
        ax.set_title(f"d = {d}", fontsize=9)
    axes[0].set_ylabel("bias ||E g - E g_on-policy||")
    many = main["algorithm"].nunique() > LEGEND_INSIDE
    axes[-1].legend(fontsize=6, **({"loc": "center left", "bbox_to_anchor": (1.02, 0.5)} if many else {}))
    fig.suptitle(
        f"Bias of each estimator against its on-policy target, tiny model\n{MARKERS}",
        fontsize=9,
    )
    written += save_both(fig, out, "gradient_bias_vs_G")

    def fitted(claim: str, d, algorithm: str, at: str) -> str:
        k = claims[
            (claims["claim"] == claim)
            & (claims["delay"] == d)
            & (claims["algorithm"] == algorithm)
            & (claims["at"] == at)
        ]
        if not len(k):
            return ""
        if pd.notna(k.iloc[0].exponent):
            return f": exponent {k.iloc[0].exponent:.2f} [{k.iloc[0].lo:.2f}, {k.iloc[0].hi:.2f}]"
        return f": no exponent (resolved points: {k.iloc[0].n_points}; a fit needs {MIN_FIT_POINTS})"

    fig, axes = panel_row(len(delays), 3.8, sharey=True)
    for ax, d in zip(axes, delays):
        for algorithm in ("tic", "gmc", "none"):
            grp = main[(main["delay"] == d) & (main["algorithm"] == algorithm)].sort_values("G")
            if len(grp):
                at = f"eps={grp['eps'].iloc[0]:g}"
                _errorbar(
                    ax,
                    grp,
                    "G",
                    "excess",
                    color=ALGORITHM_COLORS[algorithm],
                    label=algorithm + fitted("2/3", d, algorithm, at),
                )
        _log_axes(ax, 2)
        ax.set_xlabel("group size G")
        ax.set_title(f"d = {d}", fontsize=9)
        ax.legend(fontsize=6)
    axes[0].set_ylabel("excess over IS ||E (g - g_is)||")
    fig.suptitle(
        f"Claims 2-3: the cap's bias over uncapped IS against G (paired batches); legend: fitted exponent "
        f"[95% interval]\n{MARKERS}",
        fontsize=9,
    )
    written += save_both(fig, out, "gradient_excess_vs_G")

    eps_rows = rows[rows["eps_row"]]
    fig, axes = panel_row(1, 4.5)
    for algorithm, grp in eps_rows.groupby("algorithm"):
        grp = grp.sort_values("eps")
        at = f"G={grp['G'].iloc[0]:g}"
        _errorbar(
            axes[0],
            grp,
            "eps",
            "excess",
            color=ALGORITHM_COLORS[algorithm],
            label=algorithm + fitted("1", grp["delay"].iloc[0], algorithm, at),
        )
    _log_axes(axes[0])
    if len(eps_rows):
        axes[0].set_title(f"d = {eps_rows['delay'].iloc[0]}, G = {eps_rows['G'].iloc[0]}", fontsize=9)
        # the caps measured, each labelled, instead of a log axis's crowded minor labels
        caps = sorted(eps_rows["eps"].unique())
        axes[0].set_xticks(caps, [f"{e:g}" for e in caps])
        axes[0].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[0].set_xlabel("eps (cap 1+eps)")
    axes[0].set_ylabel("excess over IS ||E (g - g_is)||")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Claim 1: the cap's bias against eps; legend: fitted exponent [95% interval]\n{MARKERS}", fontsize=8)
    written += save_both(fig, out, "gradient_excess_vs_eps")
    return written


def _fmt(v, lo, hi) -> str:
    return "n/a" if pd.isna(v) else f"{v:.3g} [{lo:.3g}, {hi:.3g}]"


def lab_markdown(tables: dict[str, pd.DataFrame]) -> str:
    """The lab's tables in Markdown, under third-level headings (a page includes them): the
    pairs, the claims, and per delay the bias, excess, cosine and second moment of every
    estimator by G."""
    rows, pairs, claims, prompts = tables["gradients"], tables["pairs"], tables["claims"], tables["prompts"]
    out = [
        f"{len(prompts)} prompts, each answered right by a share of a screening group "
        f"at the behaviour weights between {prompts['screened_reward'].min():.3g} and "
        f"{prompts['screened_reward'].max():.3g}; {int(rows['n'].iloc[0])} batches per cell.",
        "",
        "### Pairs (behaviour: the history's end; current: d on-policy updates later)",
        "",
        "| d | G | mean L | min L | max L | k3 KL / token | IS ESS / G |",
        "|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| {r.delay} | {r.G} | {r.log_ratio_mean:.3g} | {r.log_ratio_min:.3g} | {r.log_ratio_max:.3g} | "
        f"{r.approx_kl:.3g} | {r.ess_frac:.3g} |"
        for r in pairs.itertuples()
    ]
    out += [
        "",
        "### Claims",
        "",
        "| claim | d | at | algorithm | value | 95% interval | points | reference | covers |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| {r.claim} | {r.delay} | {r.at} | {r.algorithm} | {r.exponent:.3g} | [{r.lo:.3g}, {r.hi:.3g}] | "
        f"{r.n_points} | {r.reference:g} | {'yes' if r.covers_reference else 'no'} |"
        for r in claims.itertuples()
    ]
    main = rows[~rows["eps_row"]]
    for d, grp_d in main.groupby("delay"):
        out += [
            "",
            f"### d = {d}",
            "",
            "| algorithm | G | bias | excess over IS | cosine | second moment | variance |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in grp_d.sort_values(["algorithm", "G"]).itertuples():
            out.append(
                f"| {r.algorithm} | {r.G} | {_fmt(r.bias, r.bias_lo, r.bias_hi)} | "
                f"{_fmt(r.excess, r.excess_lo, r.excess_hi)} | {r.cosine:.3f} | {r.second_moment:.3g} | "
                f"{r.variance:.3g} |"
            )
    eps_rows = rows[rows["eps_row"]]
    if len(eps_rows):
        out += [
            "",
            f"### eps (d = {eps_rows['delay'].iloc[0]}, G = {eps_rows['G'].iloc[0]})",
            "",
            "| algorithm | eps | bias | excess over IS | second moment |",
            "|---|---|---|---|---|",
        ]
        out += [
            f"| {r.algorithm} | {r.eps:g} | {_fmt(r.bias, r.bias_lo, r.bias_hi)} | "
            f"{_fmt(r.excess, r.excess_lo, r.excess_hi)} | {r.second_moment:.3g} |"
            for r in eps_rows.sort_values(["algorithm", "eps"]).itertuples()
        ]
    return "\n".join(out) + "\n"


def read_lab(folder: str | Path) -> dict[str, pd.DataFrame]:
    """The lab's tables from ``folder``."""
    return {name: pd.read_csv(Path(folder) / f"{name}.csv") for name in GRADIENT_LAB_TABLES}


def lab_report(folder: str | Path) -> list[Path]:
    """Redraw the lab's Markdown and figures in ``folder`` from its tables alone."""
    folder = Path(folder)
    tables = read_lab(folder)
    write_text(folder / LAB_SUMMARY, lab_markdown(tables))
    return [folder / LAB_SUMMARY, *lab_figures(tables, folder)]
