"""Figures of a sweep (PNG and PDF), one function per entry of :data:`gmc.results.outputs.FIGURES`,
and the helpers every figure of the package uses (the theory lab's are :mod:`gmc.theory.figures`).

A figure function takes the runs' frame (:func:`gmc.results.collect.collect`; curves are read from
the run directories it names) and an output folder, labels its axes, shows the 95% intervals
over seeds (:func:`gmc.results.stats.mean_interval`) and writes each figure atomically in both formats;
estimators are labelled and coloured by :data:`gmc.estimators.registry.REGISTRY`, delays by
:data:`gmc.rollouts.delays.DELAY_MODES`.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from gmc.estimators import REGISTRY  # noqa: E402
from gmc.io import save_figure  # noqa: E402
from gmc.results.outputs import FIGURES  # noqa: E402
from gmc.results.stats import mean_interval  # noqa: E402
from gmc.run.rundir import GROUPS, METRICS  # noqa: E402
from gmc.sweep.points import Delay, delay_order, is_fixed  # noqa: E402

ALGORITHM_COLORS = {name: e.color for name, e in REGISTRY.items()}
ALGORITHM_MARKERS = {name: "osD^vP*Xph"[i % 10] for i, name in enumerate(REGISTRY)}
"""Each estimator's marker, so that a league's lines of similar colour stay apart."""


LEAGUE_COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
    "#17becf", "#000000", "#f3c300", "#875692", "#a1caf1", "#008856", "#e68fac", "#604e97", "#882d17",
)  # fmt: skip
"""A league's colours, one per estimator where it has up to 18: tab10, then Kelly's colours of
maximal contrast without those close to tab10's (the registry's colours repeat similar hues)."""
LEAGUE_MARKERS = "osD^vP*Xph<>8dH"
"""A league's markers, one per estimator up to 15."""


def algorithm_styles(frame: pd.DataFrame) -> dict[str, dict]:
    """Each algorithm of ``frame`` as its lines draw it (``color``, ``marker``, ``ls``, ``mfc``): a
    registered estimator in its colour and marker, solid; a variant
    (:func:`gmc.results.collect.variant_estimators`) in its estimator's colour and marker, dashed
    and open, so that it reads as its estimator's kin and apart from every other line. A league
    (more algorithms than :data:`LEGEND_INSIDE`) takes :func:`league_styles` instead. Computed on
    a figure's whole frame, so that every panel draws an algorithm alike."""
    from gmc.results.collect import variant_estimators

    bases = variant_estimators(frame)
    styles = {}
    for algo in frame["algorithm"].unique():
        base = bases.get(algo)
        if algo not in REGISTRY and base in REGISTRY:
            styles[algo] = {
                "color": ALGORITHM_COLORS[base],
                "marker": ALGORITHM_MARKERS[base],
                "ls": "--",
                "mfc": "white",
            }
        else:
            styles[algo] = {
                "color": ALGORITHM_COLORS.get(algo),
                "marker": ALGORITHM_MARKERS.get(algo, "o"),
                "ls": "-",
                "mfc": None,
            }
    return league_styles(styles) if len(styles) > LEGEND_INSIDE else styles


def league_styles(styles: dict[str, dict]) -> dict[str, dict]:
    """``styles`` (:func:`algorithm_styles`) recoloured for a league, registry order first, then the
    rest by name: a colour, marker and line style no other algorithm shares while there are at most
    18 (colours repeat beyond, with another marker and line style); a variant stays dashed and open."""
    algorithms = [a for a in REGISTRY if a in styles] + sorted(set(styles) - set(REGISTRY))
    return {
        a: {
            **styles[a],
            "color": LEAGUE_COLORS[i % len(LEAGUE_COLORS)],
            "marker": LEAGUE_MARKERS[i % len(LEAGUE_MARKERS)],
            "ls": styles[a]["ls"] if styles[a]["ls"] != "-" else ("-", "--", ":")[i // len(LEAGUE_COLORS) % 3],
        }
        for i, a in enumerate(algorithms)
    }


def algorithm_label(name: str) -> str:
    """An estimator's legend label (its registry label; the name itself if unregistered)."""
    return REGISTRY[name].label if name in REGISTRY else name


def panel_row(n: int, width: float = 4.0, sharey: bool = False):
    """A figure with ``n`` panels side by side; returns ``(fig, axes)``."""
    fig, axes = plt.subplots(1, n, figsize=(width * n, 3.6), sharey=sharey, squeeze=False, layout="constrained")
    return fig, axes[0]


LEGEND_INSIDE = 6
"""Legend entries a panel holds inside its axes; more (a league of estimators) go beside the panels."""


def legend(fig, axes, fontsize: float = 7, beside: bool = False) -> None:
    """One legend per panel while each fits inside its axes; otherwise, or where ``beside`` asks
    for it (panels whose data leave no corner free), one legend for the figure, to the right of
    the panels, with every panel's entries (each label once), in as many columns as the figure's
    height needs, so that no line or title is hidden under it."""
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if len(entries) <= LEGEND_INSIDE and not beside:
        for ax in axes:
            if ax.get_legend_handles_labels()[1]:
                ax.legend(fontsize=fontsize)
        return
    rows = max(1, int(fig.get_figheight() * 72 / (2 * fontsize)))  # entries a column holds in the figure's height
    columns = math.ceil(len(entries) / rows)
    fig.set_figwidth(fig.get_figwidth() + 2.6 * columns)  # the panels keep their width beside it
    fig.legend(list(entries.values()), list(entries), loc="outside right center", fontsize=fontsize, ncols=columns)


def save_both(fig, out: Path, stem: str) -> list[Path]:
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    for p in paths:
        save_figure(fig, p, dpi=150)
    plt.close(fig)
    return paths


def spread(values: list, k: int = 4) -> list:
    """At most ``k`` values spread over ``values`` (first and last included)."""
    if len(values) <= k:
        return list(values)
    return [values[i] for i in sorted({round(j * (len(values) - 1) / (k - 1)) for j in range(k)})]


# ---------------------------------------------------------------------------------------------
# figures of a sweep


def _numeric_delays(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame[frame["delay"].map(is_fixed)].copy()
    out["delay"] = out["delay"].astype(int)
    return out


def _score_column(frame: pd.DataFrame) -> tuple[str, str]:
    """The headline score: mean Pass@1 over benchmarks when evaluated, else final train reward.

    Adds ``score`` and its evaluation standard error ``score_se`` (0 for the train reward) to ``frame``."""
    from gmc.results.collect import FINAL_REWARD, benchmarks_in, with_benchmark_means
    from gmc.run.evaluate import SE

    benches = benchmarks_in(frame)
    means = with_benchmark_means(frame)
    if "eval/mean/pass_at_1" in means.columns:
        frame["score"] = means["eval/mean/pass_at_1"]
        frame["score_se"] = means[f"eval/mean/pass_at_1{SE}"]
        return "score", f"Pass@1 (mean over {', '.join(benches)})"
    frame["score"] = frame[FINAL_REWARD]
    frame["score_se"] = 0.0
    return "score", "final training reward (last 20 steps)"


SCORE_RANGE = (-0.05, 1.05)
"""The score and reward axis: every score is a fraction of answers, every reward 0 or 1, so an
interval over few seeds that reaches past [0, 1] is cut at the frame instead of stretching the axis."""

CATEGORICAL_DELAYS = 4
"""Up to this many fixed delays are drawn as evenly spaced categories; more on a symlog axis
ticked at the delays."""


def _delay_axis(ax, frame: pd.DataFrame, also: list[float] = (), apart: bool = True) -> pd.DataFrame:
    """Sets ``ax``'s x axis for the fixed delays of ``frame`` and returns ``frame`` with ``x``,
    the position of each row's delay on it, each algorithm a little apart where ``apart``
    (:func:`_apart`, so that equal scores do not hide each other). ``also``: staleness values
    drawn besides the fixed delays (a named mode's mean), which put the axis in steps."""
    delays = sorted(frame["delay"].unique())
    frame = frame.copy()
    if len(delays) <= CATEGORICAL_DELAYS and not len(also):
        frame["x"] = frame["delay"].map({d: i for i, d in enumerate(delays)}).astype(float)
        ax.set_xticks(range(len(delays)), [str(d) for d in delays])
        ax.set_xlim(-0.5, len(delays) - 0.5)
        log_x = False
    else:
        frame["x"] = frame["delay"].astype(float)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xticks(delays, [str(d) for d in delays])
        ax.set_xlim(-0.5, 1.6 * max(max([*delays, *also]), 1))
        log_x = True
    if apart:
        frame["x"] = _apart(frame, log_x)
    ax.set_xlabel("delay d (steps)")
    return frame


def _apart(frame: pd.DataFrame, log_x: bool, width: float = 0.3) -> pd.Series:
    """Each row's ``x`` moved by its algorithm's place among the frame's algorithms (registry
    order), over ``width`` in all: in axis units on a linear axis, as a fraction of ``x`` on a
    logarithmic one (where ``x`` is 0: in units)."""
    algorithms = [a for a in REGISTRY if a in set(frame["algorithm"])]
    algorithms += sorted(set(frame["algorithm"]) - set(algorithms))
    offset = (
        frame["algorithm"]
        .map(
            {a: width * (i - (len(algorithms) - 1) / 2) / max(len(algorithms) - 1, 1) for i, a in enumerate(algorithms)}
        )
        .astype(float)
    )
    if not log_x:
        return frame["x"] + offset
    return frame["x"].where(frame["x"] == 0, frame["x"] * (1 + offset)) + offset.where(frame["x"] == 0, 0)


def _seed_count(seeds: pd.Series) -> str:
    """Seeds per point as a label prints them: ``3``, or ``3-5`` where the points differ."""
    return f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"


BOUNDS = (0.0, 1.0)
"""Where every plotted score, reward and ratio diagnostic lives: a fraction. An interval over few
seeds that reaches past it is cut there (the figures' titles say so)."""


def bar_extent(iv) -> tuple[float, float]:
    """The error bar of the interval ``iv`` (:func:`gmc.results.stats.mean_interval`) below and
    above its mean, cut at :data:`BOUNDS`; none without an interval (one seed)."""
    half = 0.0 if pd.isna(iv.half) else iv.half
    lo, hi = max(iv.mean - half, BOUNDS[0]), min(iv.mean + half, BOUNDS[1])
    return max(iv.mean - lo, 0.0), max(hi - iv.mean, 0.0)


def shared_note(frame: pd.DataFrame, where: str = "") -> str:
    """`` (TIC-GRPO's run at d = 0)`` for an algorithm's rows that are another estimator's run
    (``shared_with``, :func:`gmc.results.collect.collect`), ``where`` naming the delays; else ``""``."""
    if "shared_with" not in frame.columns:
        return ""
    owners = sorted(set(frame["shared_with"].dropna()))
    return f" ({', '.join(algorithm_label(o) for o in owners)}'s run{where})" if owners else ""


def _line_by_algorithm(ax, frame, x, y, styles, se=None, seeds_in_label=True):
    """Mean over seeds per ``x``, one line per algorithm, error bars = 95% interval
    (:func:`gmc.results.stats.mean_interval`, evaluation noise ``se`` folded in; none with one seed)
    cut to :data:`BOUNDS`; each label carries its seed count unless ``seeds_in_label`` is false (a
    title gives it), and names the estimator whose run a shared point is (drawn open, on top).
    ``styles``: each algorithm's, :func:`algorithm_styles` of the figure's whole frame."""
    for algo, grp in frame.groupby("algorithm"):
        points = []
        for xv, g in grp.groupby(x):
            iv = mean_interval(g[y], g[se] if se else None)
            points.append((xv, iv.mean, *bar_extent(iv)))
        xs, ms, los, his = zip(*sorted(points))
        n = _seed_count(grp.groupby(x)["seed"].nunique())
        shared = grp[grp["shared_with"].notna()] if "shared_with" in grp.columns else grp.iloc[:0]
        where = ", ".join(f"d = {d}" for d in sorted(shared["delay"].unique(), key=delay_order))
        note = shared_note(shared, f" at {where}" if where else "")
        style = {**styles[algo], **({"mfc": "white", "zorder": 3} if note else {})}
        ax.errorbar(
            xs,
            ms,
            yerr=[los, his],
            ms=4,
            capsize=2,
            **style,
            label=(f"{algorithm_label(algo)} (n = {n})" if seeds_in_label else algorithm_label(algo)) + note,
        )


def run_figures(results: str | Path, out: str | Path | None = None) -> list[Path]:
    """Every figure of :data:`gmc.results.outputs.FIGURES` from the run directories under ``results``
    (no training, no evaluation), into ``out`` (default ``<results>/figures``)."""
    from gmc.results.collect import collect

    results = Path(results)
    out = Path(out or results / "figures")
    frame = collect(results)
    return [p for entry in FIGURES.values() for p in entry.resolve()(frame.copy(), out)]


def league_figure(regimes: dict[str, str | Path], out: Path) -> list[Path]:
    """Final score against the fixed delay per estimator, one panel per regime: ``regimes`` maps a
    panel's title to its results folder (largest group size of each; delays as :func:`_delay_axis`
    places them; bars: 95% interval over seeds; each panel's title gives its seeds, and a league
    of estimators shares one legend beside the panels). Written to ``out/league.{png,pdf}``."""
    from gmc.results.collect import collect

    fig, axes = panel_row(len(regimes), 5.5)
    frames = {name: _largest_group(collect(results)) for name, results in regimes.items()}
    styles = algorithm_styles(pd.concat([frame for _, frame in frames.values()]))
    for ax, (name, (G, frame)) in zip(axes, frames.items()):
        score, score_label = _score_column(frame)
        numeric = _delay_axis(ax, _numeric_delays(frame))
        _line_by_algorithm(ax, numeric, "x", score, styles, "score_se", seeds_in_label=False)
        seeds = _seed_count(numeric.groupby(["algorithm", "delay"])["seed"].nunique())
        ax.set_title(f"{name}: G = {G}, {seeds} seeds")
        ax.set_ylabel(score_label)
        ax.set_ylim(*SCORE_RANGE)
    legend(fig, axes)
    fig.suptitle("Final score vs delay per estimator; bars: 95% interval over seeds, cut at 0 and 1")
    return save_both(fig, Path(out), "league")


def _largest_group(frame: pd.DataFrame) -> tuple[int, pd.DataFrame]:
    G = int(frame["group"].max())
    return G, frame[frame["group"] == G]


def reward_vs_step(frame: pd.DataFrame, out: Path) -> list[Path]:
    """Training reward vs step, one panel per delay, one line per algorithm (largest group size)."""
    import numpy as np

    from gmc.io import read_jsonl

    G, sub = _largest_group(frame)
    delays = sorted(sub["delay"].unique(), key=delay_order)
    fig, axes = panel_row(len(delays), 4, sharey=True)
    styles = algorithm_styles(sub)
    for ax, delay in zip(axes, delays):
        for algo, grp in sub[sub["delay"] == delay].groupby("algorithm"):
            curves = pd.concat(
                [
                    pd.Series([r.get("rollout/reward_mean", np.nan) for r in read_jsonl(Path(d) / METRICS)])
                    .rolling(10, min_periods=1)
                    .mean()
                    for d in grp["run_dir"]
                ],
                axis=1,
            )  # [step, seed]
            band = [mean_interval(row) for row in curves.to_numpy()]
            mean = np.array([iv.mean for iv in band])
            note = shared_note(grp)  # another estimator's run: the same curve, dashed over it
            ax.plot(
                curves.index,
                mean,
                color=styles[algo]["color"],
                ls=(0, (3, 3)) if note else styles[algo]["ls"],
                lw=2 if note else 1.5,
                zorder=3 if note else 2,
                label=f"{algorithm_label(algo)} (n = {curves.shape[1]}){note}",
            )
            if curves.shape[1] > 1 and not note:
                ax.fill_between(
                    curves.index,
                    [max(iv.lo, BOUNDS[0]) for iv in band],
                    [min(iv.hi, BOUNDS[1]) for iv in band],
                    color=styles[algo]["color"],
                    alpha=0.2,
                    lw=0,
                )
        ax.set_title(Delay.parse(delay).title)
        ax.set_xlabel("optimizer step")
    legend(fig, axes)
    axes[0].set_ylabel("rollout reward (10-step mean)")
    axes[0].set_ylim(*SCORE_RANGE)  # rewards are 0 or 1
    fig.suptitle(f"Training reward of fresh rollouts, G = {G}; bands: 95% interval over seeds, cut at 0 and 1")
    return save_both(fig, out, "reward_vs_step")


NAMED_MARKERS = "*hp"
"""The markers of the named delay modes' points in :func:`score_vs_delay`, one per mode."""


def consumed_staleness(run_dirs) -> np.ndarray:
    """The staleness of every group the runs consumed (their ``groups.jsonl``), pooled."""
    from gmc.io import read_jsonl

    return np.array([r["staleness"] for d in run_dirs for r in read_jsonl(Path(d) / GROUPS)], dtype=float)


def score_vs_delay(frame: pd.DataFrame, out: Path) -> list[Path]:
    """Final score vs delay, one panel per group size, each algorithm a little apart; each named
    delay mode (the latency model, real asynchrony) as a point of its own marker at its mean
    consumed staleness (:func:`consumed_staleness`), with its interval, in its estimator's colour."""
    score, score_label = _score_column(frame)
    numeric = _numeric_delays(frame)
    named = frame[~frame["delay"].map(is_fixed)].copy()
    modes = sorted(named["delay"].unique(), key=delay_order)
    staleness = {d: consumed_staleness(named.loc[named["delay"] == d, "run_dir"].unique()).mean() for d in modes}
    named["x"] = named["delay"].map(staleness).astype(float)
    named["x"] = _apart(named, log_x=True)
    groups = sorted(frame["group"].unique())
    fig, axes = panel_row(len(groups), 4.4, sharey=True)
    styles = algorithm_styles(frame)
    for ax, g in zip(axes, groups):
        _line_by_algorithm(
            ax,
            _delay_axis(ax, numeric[numeric["group"] == g], also=list(staleness.values())),
            "x",
            score,
            styles,
            "score_se",
        )
        for (algo, delay), grp in named[named["group"] == g].groupby(["algorithm", "delay"]):
            iv = mean_interval(grp[score], grp["score_se"])
            below, above = bar_extent(iv)
            ax.errorbar(
                [grp["x"].iloc[0]],
                [iv.mean],
                yerr=[[below], [above]],
                color=styles[algo]["color"],
                marker=NAMED_MARKERS[modes.index(delay) % len(NAMED_MARKERS)],
                ms=9,
                capsize=2,
                ls="none",
                label=f"{algorithm_label(algo)}, {Delay.parse(delay).title} at its mean staleness "
                f"{staleness[delay]:.1f} (n = {grp['seed'].nunique()})",
            )
        ax.set_title(f"G = {g}")
    legend(fig, axes)
    axes[0].set_ylabel(score_label)
    axes[0].set_ylim(*SCORE_RANGE)  # shared by the panels
    fig.suptitle("Final score vs delay; bars: 95% interval over seeds, cut at 0 and 1")
    return save_both(fig, out, "score_vs_delay")


def score_vs_group(frame: pd.DataFrame, out: Path) -> list[Path]:
    """Final score vs group size, one panel per delay."""
    score, score_label = _score_column(frame)
    frame["x"] = np.log2(frame["group"])  # evenly spaced powers of two
    frame["x"] = _apart(frame, log_x=False, width=0.3 if frame["group"].nunique() > 1 else 0.6)
    groups = sorted(frame["group"].unique())
    delays = sorted(frame["delay"].unique(), key=delay_order)
    fig, axes = panel_row(len(delays), 4, sharey=True)
    styles = algorithm_styles(frame)
    for ax, delay in zip(axes, delays):
        _line_by_algorithm(ax, frame[frame["delay"] == delay], "x", score, styles, "score_se")
        ax.set_xticks(np.log2(groups), [str(g) for g in groups])
        ax.set_xlim(np.log2(groups[0]) - 0.5, np.log2(groups[-1]) + 0.5)
        ax.set_xlabel("group size G")
        ax.set_title(Delay.parse(delay).title)
    legend(fig, axes)
    axes[0].set_ylabel(score_label)
    axes[0].set_ylim(*SCORE_RANGE)  # shared by the panels
    if len(groups) < 2:  # nothing varies along G: the scores at the one G, and the title says so
        fig.suptitle(
            f"This sweep ran one group size, G = {groups[0]}: no trend in G to read (final score per "
            "estimator; bars: 95% interval over seeds, cut at 0 and 1)",
            fontsize=10,
        )
    else:
        fig.suptitle("Final score vs group size; bars: 95% interval over seeds, cut at 0 and 1")
    return save_both(fig, out, "score_vs_group")


def ratio_diagnostics(frame: pd.DataFrame, out: Path) -> list[Path]:
    """Each estimator's capped fraction, ESS / G and shortfall vs delay (largest group size)."""
    import numpy as np

    G, _ = _largest_group(frame)
    panels = [
        ("capped", "fraction capped / clipped"),
        ("ratio/ess_frac", "ESS / G"),
        ("ratio/shortfall", "shortfall sum(rho - w) / sum(rho)"),
    ]
    numeric = _numeric_delays(frame)
    own = dict.fromkeys(d for e in REGISTRY.values() for d in e.diagnostics)  # each estimator's clip statistic
    capped_cols = [c for c in own if c in numeric.columns]
    numeric["capped"] = numeric[capped_cols].bfill(axis=1).iloc[:, 0] if capped_cols else np.nan
    fig, axes = panel_row(3)
    styles = algorithm_styles(numeric)
    for ax, (col, label) in zip(axes, panels):
        at = _delay_axis(ax, numeric[numeric["group"] == G])
        if col in numeric.columns:
            _line_by_algorithm(ax, at, "x", col, styles)
        ax.set_ylabel(label)
    legend(fig, axes, fontsize=8, beside=True)  # rising and falling lines fill every corner of some panel
    fig.suptitle(
        f"Ratio diagnostics vs delay (G = {G}; capped: each estimator's own fraction, the tables' 'own statistic')"
    )
    return save_both(fig, out, "ratio_diagnostics")


def staleness_vs_length(frame: pd.DataFrame, out: Path) -> list[Path]:
    """Mean staleness vs the group's longest response under each named delay mode."""
    from gmc.io import read_jsonl

    fig, ax = plt.subplots(figsize=(5, 3.6), layout="constrained")
    named = frame[~frame["delay"].map(is_fixed)]
    styles = algorithm_styles(named)
    for (delay, algo), grp in named.groupby(["delay", "algorithm"]):
        rows = [r for d in grp["run_dir"] for r in read_jsonl(Path(d) / GROUPS)]
        gdf = pd.DataFrame(rows)
        bins = pd.cut(gdf["length_max"], bins=8)
        stats = gdf.groupby(bins, observed=True)["staleness"].mean()
        centers = [b.mid for b in stats.index]
        ax.plot(
            centers,
            stats.values,
            marker="o",
            color=styles[algo]["color"],
            label=f"{algorithm_label(algo)}, {Delay.parse(delay).title}",
        )
    if named.empty:
        ax.text(
            0.5, 0.5, "no runs of a named delay mode in this sweep", ha="center", va="center", transform=ax.transAxes
        )
    else:
        ax.legend()
    ax.set_xlabel("longest response in the group (tokens)")
    ax.set_ylabel("mean staleness (optimizer updates)")
    modes = ", ".join(Delay.parse(d).title for d in sorted(named["delay"].unique(), key=delay_order))
    ax.set_title(
        f"{modes[:1].upper() + modes[1:]}: staleness by answer length" if modes else "Staleness by answer length"
    )
    return save_both(fig, out, "staleness_vs_length")


def staleness_distribution(frame: pd.DataFrame, out: Path) -> list[Path]:
    """The distribution of consumed staleness per delay that is not a fixed number (the latency
    model, real asynchrony, replayed traces), runs and seeds pooled; its title names the modes
    the sweep ran."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6), layout="constrained")
    named = frame[~frame["delay"].map(is_fixed)]
    delays = sorted(named["delay"].unique(), key=delay_order)
    width = 0.8 / max(1, len(delays))
    for i, delay in enumerate(delays):
        runs = named[named["delay"] == delay]
        lags = consumed_staleness(runs["run_dir"])
        values, counts = np.unique(lags, return_counts=True)
        ax.bar(
            values + (i - (len(delays) - 1) / 2) * width,
            counts / counts.sum(),
            width=width,
            label=f"{Delay.parse(delay).title} ({runs['seed'].nunique()} seeds, mean {lags.mean():.2f})",
        )
    if named.empty:
        ax.text(
            0.5,
            0.5,
            "no runs of a named delay mode or trace in this sweep",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    else:
        ax.legend(fontsize=8)
    ax.set_xlabel("staleness of a consumed group (optimizer updates)")
    ax.set_ylabel("fraction of consumed groups")
    modes = ", ".join(Delay.parse(d).title for d in delays)
    ax.set_title(f"Staleness of the consumed groups: {modes}" if modes else "Staleness of the consumed groups")
    return save_both(fig, out, "staleness_distribution")
