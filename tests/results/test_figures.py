"""The figures of a sweep: intervals over seeds, labels and axes."""

import pytest
from helpers import fake_run, sweep

from gmc.results.collect import collect
from gmc.results.stats import mean_interval


def test_figures_show_intervals_over_seeds(tmp_path):
    import matplotlib.pyplot as plt

    from gmc.results import figures

    r = tmp_path / "results"
    for seed, (g, t) in enumerate([(0.70, 0.50), (0.72, 0.56), (0.74, 0.52)]):
        fake_run(r, "gmc", 16, 8, seed, 0.5 + 0.1 * seed, g, se=0.02)
        fake_run(r, "tic", 16, 8, seed, 0.5, t, se=0.02)
    fake_run(r, "gmc", 0, 8, 0, 0.5, 0.7, se=0.02)
    paths = figures.run_figures(r)
    assert {p.stem for p in paths} >= {"reward_vs_step", "score_vs_delay", "score_vs_group"}
    frame = collect(r)
    figures._score_column(frame)
    fig, ax = plt.subplots()
    gmc = figures._numeric_delays(frame[frame.algorithm == "gmc"])
    figures._line_by_algorithm(ax, gmc, "delay", "score", figures.algorithm_styles(gmc), "score_se")
    bars = ax.containers[0]  # errorbar container: (line, caps, bar collections)
    segs = bars.lines[2][0].get_segments()
    half = {int(float(seg[0][0])): (seg[1][1] - seg[0][1]) / 2 for seg in segs}
    expected = mean_interval([0.35, 0.36, 0.37], [0.02] * 3).half
    assert half[0] == 0 and half[16] == pytest.approx(expected)  # one seed at delay 0: no bar
    plt.close(fig)


def test_the_league_figure_draws_a_panel_per_regime_and_one_legend_for_a_league(tmp_path, monkeypatch):
    """One panel per regime titled with its group size and seeds; a league too large for a panel's
    legend shares one beside the panels, each estimator once by its label, and estimators of
    similar colour differ by marker."""
    from gmc.estimators import REGISTRY
    from gmc.results import figures

    league = list(REGISTRY)[:8]
    short = sweep(tmp_path / "short", scores={a: [0.5 + 0.02 * i] * 3 for i, a in enumerate(league)})
    long = sweep(tmp_path / "long", scores={a: [0.4, 0.5, 0.6] for a in league[:3]})
    drawn = {}

    def keep(fig, out, stem):
        drawn[stem] = fig
        return []

    monkeypatch.setattr(figures, "save_both", keep)
    figures.league_figure({"short": short, "long": long}, tmp_path / "league")
    fig = drawn["league"]
    assert [ax.get_title() for ax in fig.axes] == ["short: G = 8, 3 seeds", "long: G = 8, 3 seeds"]
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert sorted(labels) == sorted(REGISTRY[a].label for a in league)
    assert len({bars.lines[0].get_marker() for bars in fig.axes[0].containers}) == len(league)


@pytest.mark.parametrize("entries, columns", [(5, None), (12, 1), (36, 2)])
def test_a_legend_beside_the_panels_takes_the_columns_the_figures_height_needs(entries, columns):
    """Few entries stay in the panel; a league beside it in one column while the figure's height
    holds it, in more columns when not: the drawn legend stays inside the figure's height, under
    no title."""
    import matplotlib.pyplot as plt

    from gmc.results import figures

    fig, ax = plt.subplots(figsize=(5, 3.5), layout="constrained")
    for i in range(entries):
        ax.plot([0, 1], [i, i], label=f"estimator {i} (n = 7) (a shared run at d = 0)")
    fig.suptitle("a title")
    figures.legend(fig, [ax])
    if columns is None:
        assert not fig.legends and ax.get_legend() is not None
    else:
        (legend,) = fig.legends
        fig.canvas.draw()
        assert len({round(t.get_window_extent().x0) for t in legend.get_texts()}) == columns  # as drawn
        box, height = legend.get_window_extent(), fig.bbox.height
        assert 0 <= box.y0 and box.y1 <= height
    plt.close(fig)


def test_a_variant_is_drawn_in_its_estimators_colour_and_marker_dashed_and_open(tmp_path, monkeypatch):
    """A variant (its config names the estimator it varies) shares that estimator's colour and
    marker, drawn dashed with open markers, in the curves and the error-bar figures alike; the
    other estimators keep their own colours."""
    from matplotlib.colors import to_hex

    from gmc.estimators import REGISTRY
    from gmc.results import figures

    r = tmp_path / "results"
    for seed in range(3):
        for algo in ("gmc", "grpo", "gmc_seq_is"):
            fake_run(r, algo, 16, 8, seed, 0.5, 0.6 + 0.01 * seed)
        (r / "train" / "algo~gmc_seq_is" / "delay~16" / "group~8" / f"seed~{seed}" / "config.yaml").write_text(
            "algorithm: gmc\n"
        )
    drawn = {}
    monkeypatch.setattr(figures, "save_both", lambda fig, out, stem: drawn.setdefault(stem, fig) and [])
    figures.run_figures(r)

    def lines(stem):
        ax = drawn[stem].axes[0]
        return {
            line.get_label().split(" (")[0]: line for line in ax.get_lines() if not line.get_label().startswith("_")
        }

    gmc, grpo = REGISTRY["gmc"], REGISTRY["grpo"]
    curves = lines("reward_vs_step")
    assert to_hex(curves["gmc_seq_is"].get_color()) == to_hex(gmc.color) != to_hex(curves[grpo.label].get_color())
    assert curves["gmc_seq_is"].get_linestyle() == "--" and curves[gmc.label].get_linestyle() == "-"
    bars = {c.get_label().split(" (")[0]: c.lines[0] for c in drawn["score_vs_delay"].axes[0].containers}
    variant, base = bars["gmc_seq_is"], bars[gmc.label]
    assert to_hex(variant.get_color()) == to_hex(base.get_color()) == to_hex(gmc.color)
    assert variant.get_marker() == base.get_marker() and variant.get_linestyle() == "--"
    assert variant.get_markerfacecolor() == "white" and base.get_markerfacecolor() != "white"


def test_coinciding_points_are_apart_intervals_cut_at_0_and_1_and_league_styles_distinct():
    import matplotlib.pyplot as plt
    import pandas as pd

    from gmc.estimators import REGISTRY
    from gmc.results.figures import _apart, _line_by_algorithm, algorithm_styles

    same = pd.DataFrame({"algorithm": ["tic", "gmc", "grpo"], "x": [0.0, 0.0, 0.0]})
    assert _apart(same, log_x=False).nunique() == 3 and _apart(same, log_x=True).nunique() == 3
    fig, ax = plt.subplots()
    wide = pd.DataFrame({"algorithm": "tic", "delay": "0", "seed": [0, 1], "x": 0.0, "score": [0.0, 0.95]})
    _line_by_algorithm(ax, wide, "x", "score", algorithm_styles(wide))
    ys = [y for c in ax.collections for seg in c.get_segments() for _, y in seg]
    assert min(ys) == 0.0 and max(ys) == 1.0  # the t-interval of two seeds reaches far past both
    plt.close(fig)
    styles = algorithm_styles(pd.DataFrame({"algorithm": list(REGISTRY)}))  # a league: distinct styles
    assert len({(s["color"], s["marker"], str(s["ls"])) for s in styles.values()}) == len(REGISTRY)
    assert len({s["color"] for s in styles.values()}) == min(len(REGISTRY), 18)


def test_score_vs_delay_puts_a_named_mode_at_its_mean_staleness_and_names_a_shared_run(tmp_path, monkeypatch):
    """On the default bundle: the latency model is one point at its mean consumed staleness (not a
    line across every delay), and gmc at delay 0, tic's run, is labelled so and drawn beside it."""
    import matplotlib.pyplot as plt
    from helpers import REPO

    from gmc.results import figures
    from gmc.results.collect import collect

    bundle = REPO / "published" / "default"
    frame = collect(bundle)
    latency = frame[frame["delay"] == "latency"]["run_dir"]
    mean = figures.consumed_staleness(latency).mean()
    drawn = {}
    monkeypatch.setattr(figures, "save_both", lambda fig, out, stem: drawn.setdefault(stem, fig) and [])
    figures.score_vs_delay(frame, tmp_path)
    (ax,) = drawn["score_vs_delay"].axes
    labels = [c.get_label() for c in ax.containers]
    assert "GMC-GRPO (n = 5) (TIC-GRPO's run at d = 0)" in labels
    (point,) = [c for c in ax.containers if "latency model at its mean staleness" in c.get_label()]
    assert abs(point.lines[0].get_xdata()[0] - mean) < 0.1 * mean and f"{mean:.1f}" in point.get_label()
    assert not [line for line in ax.get_lines() if len(set(line.get_ydata())) == 1 and len(line.get_xdata()) == 2]
    at_zero = {c.get_label().split(" (")[0]: c.lines[0].get_xdata()[0] for c in ax.containers[:3]}
    assert at_zero["GMC-GRPO"] != at_zero["TIC-GRPO"]
    plt.close("all")
