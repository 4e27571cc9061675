"""The registries of tables and figures, and what results take from the other registries: a new
estimator, delay mode, table or figure needs its registry entry and nothing else."""

import json
from pathlib import Path

import pytest

from gmc import estimators
from gmc.estimators import REGISTRY
from gmc.estimators.registry import PG_SEQ_MEAN
from gmc.results import collect, figures, outputs, tables
from gmc.rollouts import delays
from gmc.rollouts.delays import DELAY_MODES, DelayMode
from gmc.sweep.points import Delay, delay_order


def _fake_results(root: Path, points):
    """Finished run directories with the files tables and figures read (no training)."""
    for algo, delay, group in points:
        run = root / "train" / f"algo~{algo}" / f"delay~{delay}" / f"group~{group}" / "seed~0"
        run.mkdir(parents=True)
        own = {"gmc": "ratio/frac_groups_capped", "newest": "ratio/frac_new_capped"}.get(algo)
        summary = {
            "steps": 4,
            "rollout/reward_mean_last20": 0.5,
            "async/staleness_mean": 1.0,
            "ratio/ess_frac": 0.9,
            "ratio/shortfall": 0.01,
            "time/step_seconds": 0.1,
            **({own: 0.2} if own else {}),
        }
        (run / "summary.json").write_text(json.dumps(summary))
        (run / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": s, "rollout/reward_mean": 0.1 * s}) + "\n" for s in range(4))
        )
        (run / "groups.jsonl").write_text(
            "".join(json.dumps({"staleness": s % 3, "length_max": 5 + s}) + "\n" for s in range(12))
        )
        ev = root / "eval" / run.relative_to(root / "train")
        ev.mkdir(parents=True)
        (ev / "synthetic.json").write_text(json.dumps({"benchmark": "synthetic", "greedy": 0.4, "pass_at_1": 0.3}))


def test_a_new_delay_mode_and_estimator_need_only_their_registry_entries(tmp_path, monkeypatch):
    monkeypatch.setitem(
        DELAY_MODES,
        "bursty",
        DelayMode("gmc.rollouts.sources:latency_source", "bursty arrivals", delays.LATENCY_KEYS, named_point=True),
    )
    monkeypatch.setitem(
        REGISTRY,
        "newest",
        estimators.Estimator(
            "gmc.estimators.losses:grpo_loss",
            "Newest-GRPO",
            "tab:pink",
            ("ratio/frac_new_capped",),
            aggregation="seq_mean",
            on_policy=PG_SEQ_MEAN,
            needs_batch_stats=False,
        ),
    )
    monkeypatch.setitem(figures.ALGORITHM_COLORS, "newest", "tab:pink")
    _fake_results(tmp_path, [(a, d, 4) for a in ("gmc", "newest") for d in ("0", "8", "latency", "bursty")])
    frame = collect.collect(tmp_path)
    assert list(dict.fromkeys(frame["delay"])) == ["0", "8", "latency", "bursty"]
    assert Delay.parse("bursty").title == "bursty arrivals" and Delay.parse("8").title == "delay d = 8"
    assert Delay.parse("trace-run7").title == "replayed trace run7"
    written = tables.write_tables(tmp_path)
    assert "ratio/frac_new_capped:mean" in written["diagnostics"].columns
    assert figures.algorithm_label("newest") == "Newest-GRPO"
    paths = figures.run_figures(tmp_path)
    assert len(paths) == 2 * len(outputs.FIGURES) and all(p.stat().st_size > 0 for p in paths)
    with pytest.raises(ValueError, match="neither a number, a named delay mode"):
        delay_order("sometimes")


def extra_figure(frame, out):
    from gmc.results.figures import panel_row, save_both

    fig, (ax,) = panel_row(1)
    ax.bar(frame["algorithm"], frame["rollout/reward_mean_last20"])
    return save_both(fig, out, "extra_figure")


def extra_table(runs, base, analysis):
    from gmc.results.render import Rendered

    table = runs[["algorithm", "delay"]].drop_duplicates()
    return Rendered(table, table.to_string(), "")


def test_a_new_figure_and_table_need_only_their_registry_entries(tmp_path, monkeypatch, load_rules):
    from gmc.results.outputs import Output

    monkeypatch.setitem(
        outputs.FIGURES, "extra_figure", Output(f"{__name__}:extra_figure", "rewards", "Rewards as bars.")
    )
    monkeypatch.setitem(outputs.TABLES, "extra_table", Output(f"{__name__}:extra_table", "points", "The points."))
    _fake_results(tmp_path, [("gmc", "0", 4), ("gmc", "8", 4)])
    assert "extra_table" in tables.write_tables(tmp_path)
    assert {p.name for p in figures.run_figures(tmp_path)} >= {"extra_figure.png", "extra_figure.pdf"}
    assert (tmp_path / "tables" / "extra_table.md").read_text().strip().startswith("algorithm")
    # the workflow's rules read the same registries
    rules = load_rules(tmp_path / "wf")
    assert {Path(f).name for f in rules["figures_from_results"].output} >= {"extra_figure.png", "extra_figure.pdf"}
    assert {Path(f).name for f in rules["tables"].output} >= {f"extra_table.{e}" for e in ("csv", "md", "tex", "html")}
    assert "<h1>extra_table: points</h1>" in (tmp_path / "tables" / "extra_table.html").read_text()
