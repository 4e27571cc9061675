"""Registries of estimators, delay modes and benchmarks: each entry is complete and true, and
tables and figures take names, order and labels from them (a new entry needs nothing else)."""

import json
from pathlib import Path

import pytest
import torch

from gmc import analysis, asynchrony, delays, estimator_info, outputs, plots, sweep
from gmc.asynchrony import LatencySource
from gmc.config import TrainConfig
from gmc.data import BENCHMARKS, REFERENCE_SOLUTION_FIELDS, benchmark_specs
from gmc.delays import DELAY_MODES, DelayConfig, DelayMode, make_source, named_delays
from gmc.estimator_info import REGISTRY, diagnostic_names
from gmc.estimators import EstimatorConfig, get_estimator
from gmc.evaluate import DEFAULT_SAMPLES, EvalConfig


def _stale_batch(seed=0, B=4, G=4, T=6):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, G, T, generator=gen) * 2
    logp_b = logp - 0.8 * torch.randn(B, G, T, generator=gen)  # far from on-policy: caps and clips fire
    mask = torch.ones(B, G, T, dtype=torch.bool)
    mask[:, :, -2:] = torch.rand(B, G, 2, generator=gen) > 0.5
    adv = torch.randn(B, G, generator=gen)
    return logp.requires_grad_(), logp_b, mask, adv


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_entry_resolves_its_loss_and_the_loss_reports_the_diagnostics_it_names(name):
    entry = REGISTRY[name]
    assert entry.label and entry.color and entry.loss.count(":") == 1
    assert entry.aggregation in estimator_info.AGGREGATIONS and isinstance(entry.needs_batch_stats, bool)
    hash(entry.on_policy)
    loss_fn = entry.resolve()
    assert callable(loss_fn) and get_estimator(name) is loss_fn
    _, stats = loss_fn(*_stale_batch(), EstimatorConfig())
    for key in entry.diagnostics:
        assert key in stats and 0 < stats[key] <= 1, (name, key, stats.get(key))


def test_an_unknown_estimator_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown estimator 'ppo'; known: \['cispo', "):
        get_estimator("ppo")


def test_diagnostic_names_cover_every_estimator_once():
    names = diagnostic_names()
    assert len(names) == len(set(names))
    assert {"ratio/frac_groups_capped", "ratio/frac_traj_capped", "ratio/frac_tokens_clipped",
            "ratio/frac_seq_clipped", "ratio/frac_tokens_masked", "ratio/frac_seq_masked", "ratio/frac_tokens_damped",
            "ratio/ess_frac", "ratio/shortfall"} == set(names)


def test_delay_modes_build_their_sources_and_bad_modes_list_the_registry():
    records = [{"prompt": "1+1", "answer": "2"}] * 4
    for mode, entry in DELAY_MODES.items():
        assert entry.label and set(entry.keys) <= {f for f in DelayConfig.__dataclass_fields__} - {"mode"}
        if entry.in_process:  # ray's builder is tested with Ray (tests/test_ray.py)
            source = make_source(TrainConfig(delay=DelayConfig(mode=mode, d=2), prompts_per_step=2), None, records)
            assert isinstance(source, asynchrony.SyncSource)
    assert isinstance(make_source(TrainConfig(delay=DelayConfig(mode="latency")), None, records), LatencySource)
    assert named_delays() == ["latency", "ray"]
    # whether a run can train on-policy is the delay mode's answer alone
    assert [delays.on_policy(DelayConfig(mode=m, d=d)) for m, d in
            (("sync", 0), ("fixed", 0), ("fixed", 1), ("latency", 0))] == [True, True, False, False]
    with pytest.raises(ValueError, match=r"delay.mode: unknown delay mode 'bursty'; known: \['sync', 'fixed', 'latency', 'ray', 'trace'\]"):
        DelayConfig(mode="bursty")


def test_benchmarks_carry_label_k_and_reference_solutions():
    assert list(benchmark_specs()) == ["synthetic", *BENCHMARKS]
    assert all(spec.label for spec in benchmark_specs().values())
    assert DEFAULT_SAMPLES == {"synthetic": 4, "math500": 4, "aime24": 16, "aime25": 16, "amc23": 16,
                               "minerva_math": 4, "olympiadbench": 4}
    assert EvalConfig().k_for("aime25") == 16 and EvalConfig(samples={"aime25": 2}).k_for("aime25") == 2
    assert set(REFERENCE_SOLUTION_FIELDS) == {"math500", "aime24", "minerva_math", "olympiadbench"}


# ---------------------------------------------------------------------------------------------
# a new delay mode and a new estimator reach tables and figures through their registry entries


def _fake_results(root: Path, points):
    """Finished run directories with the files tables and figures read (no training)."""
    for algo, delay, group in points:
        run = root / "train" / f"algo~{algo}" / f"delay~{delay}" / f"group~{group}" / "seed~0"
        run.mkdir(parents=True)
        own = {"gmc": "ratio/frac_groups_capped", "newest": "ratio/frac_new_capped"}.get(algo)
        summary = {"steps": 4, "rollout/reward_mean_last20": 0.5, "async/staleness_mean": 1.0,
                   "ratio/ess_frac": 0.9, "ratio/shortfall": 0.01, "time/step_seconds": 0.1, **({own: 0.2} if own else {})}
        (run / "summary.json").write_text(json.dumps(summary))
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "rollout/reward_mean": 0.1 * s}) + "\n"
                                                   for s in range(4)))
        (run / "groups.jsonl").write_text("".join(json.dumps({"staleness": s % 3, "length_max": 5 + s}) + "\n"
                                                  for s in range(12)))
        ev = root / "eval" / run.relative_to(root / "train")
        ev.mkdir(parents=True)
        (ev / "synthetic.json").write_text(json.dumps({"benchmark": "synthetic", "greedy": 0.4, "pass_at_1": 0.3}))


def test_a_new_delay_mode_and_estimator_need_only_their_registry_entries(tmp_path, monkeypatch):
    monkeypatch.setitem(DELAY_MODES, "bursty", DelayMode("gmc.asynchrony:latency_source", "bursty arrivals",
                                                         delays.LATENCY_KEYS, named_point=True))
    monkeypatch.setitem(REGISTRY, "newest", estimator_info.Estimator(
        "gmc.estimators:grpo_loss", "Newest-GRPO", "tab:pink", ("ratio/frac_new_capped",), aggregation="seq_mean",
        on_policy=estimator_info.PG_SEQ_MEAN, needs_batch_stats=False))
    monkeypatch.setitem(plots.METHOD_COLORS, "newest", "tab:pink")
    points = [(a, d, 4) for a in ("gmc", "newest") for d in ("0", "8", "latency", "bursty")]
    _fake_results(tmp_path, points)
    frame = analysis.collect(tmp_path)
    assert list(dict.fromkeys(frame["delay"])) == ["0", "8", "latency", "bursty"]
    assert sweep.delay_title("bursty") == "bursty arrivals" and sweep.delay_title("8") == "delay d = 8"
    assert sweep.delay_title("trace-run7") == "replayed trace run7"
    tables = analysis.write_tables(tmp_path)
    assert "ratio/frac_new_capped:mean" in tables["diagnostics"].columns
    assert plots.method_label("newest") == "Newest-GRPO"
    paths = plots.run_figures(tmp_path)
    assert len(paths) == 2 * len(outputs.FIGURES) and all(p.stat().st_size > 0 for p in paths)
    with pytest.raises(ValueError, match="neither a number, a named delay mode"):
        sweep.delay_order("sometimes")


def test_staleness_stats_without_torch_are_exact():
    groups = [asynchrony.Group(0, torch.zeros(1), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool),
                               torch.zeros(1), None, torch.zeros(1, 1), version=v, consumed_version=5)
              for v in (5, 3, 2)]
    stats = asynchrony.staleness_stats(groups)
    assert stats == {"async/staleness_mean": pytest.approx(5 / 3), "async/staleness_max": 3.0,
                     "async/staleness_min": 0.0}


# ---------------------------------------------------------------------------------------------
# a new rollout engine, figure or table is one registry entry (docs/extending.md)


CALLS: list[int] = []


def counting_engine(model, tokenizer, model_path, seed, settings, dtype):
    """An engine that samples like the HF engine and counts its calls."""
    from gmc.rollout import HFEngine

    class Counting(HFEngine):
        def generate(self, prompts, n, sampling):
            CALLS.append(len(prompts))
            return super().generate(prompts, n, sampling)

    return Counting(model, tokenizer, seed=seed)


def test_a_new_rollout_engine_needs_only_its_registry_entry(tmp_path, monkeypatch, train_small):
    from gmc.engines import ENGINES, Engine

    CALLS.clear()
    monkeypatch.setitem(ENGINES, "counting", Engine(f"{__name__}:counting_engine", "counting HF engine", ("cpu",),
                                                    shares_model=True))
    metrics = train_small(tmp_path / "run", steps=2, engine="counting", **{"delay.d": 1})
    assert len(metrics) == 2 and CALLS == [3, 3, 3]  # the prefill batch and one per step
    plain = train_small(tmp_path / "plain", steps=2, **{"delay.d": 1})
    assert [r["train/loss"] for r in metrics] == [r["train/loss"] for r in plain]


def extra_figure(frame, out):
    from gmc.plots import panel_row, save_both

    fig, (ax,) = panel_row(1)
    ax.bar(frame["algorithm"], frame["rollout/reward_mean_last20"])
    return save_both(fig, out, "extra_figure")


def extra_table(runs, base):
    from gmc.analysis import Rendered

    table = runs[["algorithm", "delay"]].drop_duplicates()
    return Rendered(table, table.to_string(), "")


def test_a_new_figure_and_table_need_only_their_registry_entries(tmp_path, monkeypatch, load_rules):
    from gmc import outputs
    from gmc.outputs import Output

    monkeypatch.setitem(outputs.FIGURES, "extra_figure", Output(f"{__name__}:extra_figure", "Rewards as bars."))
    monkeypatch.setitem(outputs.TABLES, "extra_table", Output(f"{__name__}:extra_table", "The points."))
    _fake_results(tmp_path, [("gmc", "0", 4), ("gmc", "8", 4)])
    assert "extra_table" in analysis.write_tables(tmp_path)
    assert {p.name for p in plots.run_figures(tmp_path)} >= {"extra_figure.png", "extra_figure.pdf"}
    assert (tmp_path / "tables" / "extra_table.md").read_text().strip().startswith("algorithm")
    # the workflow's rules read the same registries
    rules = load_rules(tmp_path / "wf")
    assert {Path(f).name for f in rules["figures_from_results"].output} >= {"extra_figure.png", "extra_figure.pdf"}
    assert {Path(f).name for f in rules["tables"].output} >= {f"extra_table.{e}" for e in ("csv", "md", "tex")}


def test_every_engine_with_settings_has_them_under_its_name_in_train_and_evaluate_configs():
    import typing

    from gmc.config import TrainConfig
    from gmc.engines import ENGINES

    for name, entry in ENGINES.items():
        assert entry.label and entry.devices and entry.make.count(":") == 1
        if entry.settings is not None:
            for cls in (TrainConfig, EvalConfig):
                assert typing.get_type_hints(cls)[name] is entry.settings, (name, cls.__name__)
