"""Tuning apart from confirming: the pre-registered hypotheses' contrasts, family and findings,
the tuning rule and its file, the sweep that trains with it, and the seeds a study needs."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import fake_run
from scipy import stats as sps

from gmc.results.collect import collect
from gmc.results.hypotheses import finding, parse_contrast
from gmc.results.inference import hypothesis_tests, seed_plan
from gmc.results.outputs import AnalysisConfig, table_names
from gmc.results.stats import detectable, holm, seeds_for
from gmc.results.tables import write_tables
from gmc.settings import ConfigError, from_section
from gmc.workflow import load

HYPOTHESES = [
    {"name": "H1", "contrast": "gmc@64 - tic@64", "predict": "negative"},
    {"name": "H2", "contrast": "(tic@64 - tic@0) - (grpo@64 - grpo@0)", "predict": "positive"},
    {"name": "H3", "contrast": "grpo@64 - grpo@0", "predict": "negative"},
    {"name": "H4", "contrast": "tic@64 - tic@0", "predict": "equivalent"},
]


def analysis(**values) -> AnalysisConfig:
    return from_section(AnalysisConfig, values, "analysis")


def test_a_contrast_reads_as_signed_cells_that_sum_to_zero():
    assert parse_contrast("gmc@64 - tic@64") == {("gmc", "64"): 1, ("tic", "64"): -1}
    assert parse_contrast("(tic@64 - tic@0) − (grpo@64 - grpo@0)") == {
        ("tic", "64"): 1,
        ("tic", "0"): -1,
        ("grpo", "64"): -1,
        ("grpo", "0"): 1,
    }
    assert parse_contrast("-(a@latency - b@trace-x)") == {("a", "latency"): -1, ("b", "trace-x"): 1}
    for text, says in [
        ("gmc@64", "sum to 1, not 0"),
        ("a@1 - a@1", "no cell is left"),
        ("a@1 -", "no term after it"),
        ("(a@1 - b@1", "without its ')'"),
        ("a@1 - b@1)", "without its '('"),
        ("a@1 b@1", "two terms"),
        ("a@1 * b@1", "cannot read '* b@1'"),
    ]:
        with pytest.raises(ValueError, match=re_escape(says)):
            parse_contrast(text)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_a_bad_hypothesis_is_named_by_its_key():
    with pytest.raises(ConfigError, match=r"analysis.hypotheses\[0\].contrast: 'gmc@64': its coefficients sum to 1"):
        analysis(hypotheses=[{"name": "H1", "contrast": "gmc@64", "predict": "negative"}])
    with pytest.raises(ConfigError, match=r"analysis.hypotheses\[0\].predict"):
        analysis(hypotheses=[{"name": "H1", "contrast": "a@1 - b@1", "predict": "larger"}])


@pytest.mark.parametrize(
    ("predict", "diff", "p_holm", "p_equivalent_holm", "found"),
    [
        ("negative", -0.1, 0.01, 1.0, "confirmed"),
        ("negative", +0.1, 0.01, 1.0, "contradicted"),
        ("negative", -0.01, 0.5, 0.01, "contradicted"),  # equivalent to zero: no difference of the size powered for
        ("negative", -0.1, 0.2, 0.3, "undecided"),
        ("positive", +0.1, 0.04, 1.0, "confirmed"),
        ("positive", -0.1, 0.04, 1.0, "contradicted"),
        ("equivalent", 0.01, 0.6, 0.02, "confirmed"),
        ("equivalent", 0.01, 0.01, 0.02, "confirmed"),  # resolved and inside the margin: still equivalent
        ("equivalent", 0.2, 0.01, 1.0, "contradicted"),
        ("equivalent", 0.03, 0.3, 0.2, "undecided"),
    ],
)
def test_what_the_tests_find_of_a_prediction(predict, diff, p_holm, p_equivalent_holm, found):
    assert finding(predict, diff, p_holm, p_equivalent_holm, 0.05) == found


SCORES = {  # per seed: grpo@0, grpo@64, tic@0, tic@64, gmc@64 (greedy; Pass@1 is half)
    0: (0.80, 0.50, 0.84, 0.82, 0.70),
    1: (0.76, 0.52, 0.80, 0.81, 0.64),
    2: (0.82, 0.58, 0.86, 0.84, 0.72),
    3: (0.74, 0.46, 0.78, 0.79, 0.60),
}


def confirm_runs(r):
    """grpo, tic and gmc at delays 0 and 64, gmc's on-policy run tic's (a shared run)."""
    for seed, (p0, p64, t0, t64, g64) in SCORES.items():
        for algo, delay, score in (("grpo", 0, p0), ("grpo", 64, p64), ("tic", 0, t0), ("tic", 64, t64)):
            fake_run(r, algo, delay, 8, seed, score, score, se=0.01)
        fake_run(r, "gmc", 64, 8, seed, g64, g64, se=0.01)
        gmc = r / "train" / "algo~gmc" / "delay~0" / "group~8" / f"seed~{seed}"
        gmc.mkdir(parents=True)
        (gmc / "shared.json").write_text(json.dumps({"run": f"algo~tic/delay~0/group~8/seed~{seed}"}))


def test_hypotheses_are_one_family_of_per_seed_contrasts_by_hand(tmp_path):
    r = tmp_path / "results"
    confirm_runs(r)
    h = [from_section(AnalysisConfig, {"hypotheses": HYPOTHESES}, "analysis").hypotheses][0]
    tests = hypothesis_tests(collect(r), h, margin=0.05).set_index("name")
    p0, p64, t0, t64, g64 = (np.array(c) / 2 for c in zip(*SCORES.values()))  # Pass@1
    contrasts = {"H1": g64 - t64, "H2": (t64 - t0) - (p64 - p0), "H3": p64 - p0, "H4": t64 - t0}
    ps = {}
    for name, d in contrasts.items():
        n, sd = len(d), d.std(ddof=1)
        half = sps.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        row = tests.loc[name]
        assert (row["diff"], row["lo"], row["hi"], row["n_seeds"]) == pytest.approx(
            (d.mean(), d.mean() - half, d.mean() + half, 4)
        )
        ps[name] = 2 * sps.t.sf(abs(d.mean()) / (sd / math.sqrt(n)), n - 1)
        assert row["p"] == pytest.approx(ps[name])
    assert list(tests["p_holm"]) == pytest.approx(list(holm(list(ps.values()))))
    assert set(tests["family"]) == {"hypotheses"}
    assert dict(tests["finding"]) == {"H1": "confirmed", "H2": "confirmed", "H3": "confirmed", "H4": "confirmed"}


def test_a_paired_difference_of_a_hypothesis_runs_is_that_test_alone(tmp_path):
    """gmc − tic at delay 64 and each cost of staleness pair the runs of a hypothesis: the paired
    table marks them as that test and gives them its verdict, its family counts them no more, and
    the conclusions list each test once, the hypotheses first."""
    r = tmp_path / "results"
    confirm_runs(r)
    (r / "configs").mkdir()
    (r / "configs" / "analysis.yaml").write_text(yaml.safe_dump({"hypotheses": HYPOTHESES}))
    tables = write_tables(r)
    assert set(tables) == {*table_names(AnalysisConfig()), "hypotheses"}
    paired = tables["paired"]
    mean = paired[paired.metric == "eval/mean/pass_at_1"].set_index(["comparison", "delay"])
    hyp = tables["hypotheses"].set_index("name")
    for (comparison, delay), name in {
        ("gmc − tic", "64"): "H1",
        ("grpo: stale − on-policy", "64"): "H3",
        ("tic: stale − on-policy", "64"): "H4",
    }.items():
        row = mean.loc[(comparison, delay)]
        assert row["same_test_as"] == f"hypothesis {name}" and row["family"] == "hypotheses"
        assert (row["p_holm"], row["verdict"]) == (pytest.approx(hyp.loc[name, "p_holm"]), hyp.loc[name, "verdict"])
    conclusions = tables["conclusions"]
    primary = conclusions[conclusions.role == "primary"]
    assert list(primary.family.drop_duplicates()) == ["hypotheses", "paired"]
    assert list(primary[primary.family == "hypotheses"]["finding"]) == ["confirmed"] * 4
    paired_family = primary[primary.family == "paired"]
    assert not paired_family["same_test_as"].str.startswith("hypothesis").any()  # listed under their family
    paired_tests = mean[mean["same_test_as"] == ""]
    assert set(primary[primary.family == "paired"]["family_size"]) == {len(paired_tests)}
    league = tables["league"].set_index("algorithm")
    assert (
        league.loc["tic", "vs_gmc:family"] == "hypotheses"
        and league.loc["grpo", "staleness_cost:family"] == "hypotheses"
    )
    md = (r / "tables" / "conclusions.md").read_text()
    assert "## Pass@1, primary: hypotheses family\n\n4 tests;" in md
    assert "- H1: gmc@64 - tic@64, G = 8: " in md and "as predicted: **confirmed**" in md
    assert "| H2 | (tic@64 - tic@0) - (grpo@64 - grpo@0) | positive |" in (r / "tables" / "hypotheses.md").read_text()


def test_a_hypothesis_of_a_cell_the_sweep_did_not_run_is_named(tmp_path):
    r = tmp_path / "results"
    confirm_runs(r)
    h = analysis(hypotheses=[{"name": "H9", "contrast": "is@64 - gmc@64", "predict": "negative"}]).hypotheses
    with pytest.raises(ValueError, match="hypothesis H9: the sweep has no run of is at delay 64, G = 8"):
        hypothesis_tests(collect(r), h, 0.05)


def test_a_true_null_confirms_a_predicted_sign_about_as_often_as_alpha_allows():
    """Simulated sweeps of known truth: with no true difference a predicted sign is confirmed in
    at most alpha / 2 of them per hypothesis (Holm keeps it below); with a true difference of
    twice the spread over 14 seeds it is confirmed in nearly all."""
    rng = np.random.default_rng(0)
    h = analysis(
        hypotheses=[{"name": f"H{i}", "contrast": f"a{i}@64 - b{i}@64", "predict": "positive"} for i in range(3)]
    )
    found = {0.0: [], 0.1: []}
    for truth in found:
        for _ in range(200):
            rows = []
            for seed in range(14):
                for i in range(3):
                    base = rng.normal(0.5, 0.05)
                    rows += [
                        dict(
                            algorithm=f"a{i}",
                            delay="64",
                            group=8,
                            seed=seed,
                            run_dir=f"a{i}/{seed}",
                            **{"eval/s/pass_at_1": base + truth + rng.normal(0, 0.05)},
                        ),
                        dict(
                            algorithm=f"b{i}",
                            delay="64",
                            group=8,
                            seed=seed,
                            run_dir=f"b{i}/{seed}",
                            **{"eval/s/pass_at_1": base},
                        ),
                    ]
            tests = hypothesis_tests(pd.DataFrame(rows), h.hypotheses, 0.05)
            found[truth] += list(tests["finding"])
    assert np.mean([f == "confirmed" for f in found[0.0]]) < 0.04
    assert np.mean([f == "confirmed" for f in found[0.1]]) > 0.95


def tuning_runs(r):
    """tic at eps 0.2 and two variants, gmc at eps 0.2 and one, at delay 64, three seeds."""
    means = {"tic": 0.70, "tic_eps_0_05": 0.60, "tic_eps_0_5": 0.78, "gmc": 0.62, "gmc_eps_0_05": 0.66}
    eps = {"tic": 0.2, "tic_eps_0_05": 0.05, "tic_eps_0_5": 0.5, "gmc": 0.2, "gmc_eps_0_05": 0.05}
    for seed in range(3):
        for name, m in means.items():
            fake_run(r, name, 64, 8, seed, m, m + 0.02 * seed, se=0.01)
            config = {"algorithm": name.split("_")[0], "estimator": {"eps": eps[name], "eps_low": 0.2}}
            (r / "train" / f"algo~{name}" / "delay~64" / "group~8" / f"seed~{seed}" / "config.yaml").write_text(
                yaml.safe_dump(config)
            )
    (r / "configs").mkdir()
    (r / "configs" / "analysis.yaml").write_text(yaml.safe_dump({"tune": ["tic", "gmc"]}))


def test_the_tuning_rule_chooses_the_highest_mean_and_writes_its_settings(tmp_path):
    r = tmp_path / "results"
    tuning_runs(r)
    table = write_tables(r)["tuning"]
    chosen = table[table.chosen].set_index("estimator")
    assert dict(chosen["candidate"]) == {"tic": "tic_eps_0_5", "gmc": "gmc_eps_0_05"}
    assert list(table[table.estimator == "tic"]["candidate"]) == ["tic", "tic_eps_0_05", "tic_eps_0_5"]
    assert json.loads(chosen.loc["tic", "settings"]) == {"eps": 0.5}  # the settings that vary, alone
    tuned = yaml.safe_load((r / "tables" / "tuned.yaml").read_text())
    assert tuned["delay"] == "64" and tuned["group"] == 8
    assert tuned["estimators"]["tic"] == {
        "chosen": "tic_eps_0_5",
        "mean": pytest.approx(0.78 / 2 + 0.01),
        "seeds": 3,
        "estimator": {"eps": 0.5},
    }
    assert tuned["estimators"]["gmc"]["estimator"] == {"eps": 0.05}
    assert "| tic | tic_eps_0_5 | eps 0.5 | 64 | 8 |" in (r / "tables" / "tuning.md").read_text()


SWEEP = {
    "model": "tiny",
    "train": {"steps": 4, "estimator": {"eps": 0.2}, "delay": {"warmup": "history"}},
    "sweep": {"algorithm": ["grpo", "tic", "gmc"], "delay": [0, 4], "group_size": [4], "seed": [0]},
}


def test_a_sweep_trains_each_tuned_estimator_with_its_chosen_settings_from_one_history(tmp_path):
    r = tmp_path / "tune"
    tuning_runs(r)
    write_tables(r)
    sweep = load({**SWEEP, "tuned": str(r / "tables" / "tuned.yaml")})
    eps = {p.path: sweep.run(p).estimator.eps for p in sweep.points}
    assert {path.split("/")[0]: e for path, e in eps.items()} == {"algo~grpo": 0.2, "algo~tic": 0.5, "algo~gmc": 0.05}
    assert len({name for name, _ in sweep.histories.values()}) == 1  # grpo's history ignores the caps
    assert not sweep.shared  # tic and gmc at delay 0 are no longer one run: their settings differ


def test_a_bad_tuned_file_is_named_by_its_key(tmp_path):
    with pytest.raises(ConfigError, match="tuned: cannot read the tuning sweep's choice"):
        load({**SWEEP, "tuned": str(tmp_path / "missing.yaml")})
    bad = tmp_path / "tuned.yaml"
    bad.write_text("estimators: {tic: 0.5}\n")
    with pytest.raises(ConfigError, match="tuned: .* is not a tuning sweep's choice"):
        load({**SWEEP, "tuned": str(bad)})
    bad.write_text("estimators: {ppo: {estimator: {eps: 0.1}}}\n")
    with pytest.raises(ConfigError, match="tuned: .* tunes 'ppo', which is no estimator"):
        load({**SWEEP, "tuned": str(bad)})


@pytest.mark.parametrize(("sd", "m"), [(0.04, 5), (0.05, 5), (0.02, 8)])
def test_the_seeds_a_study_needs_are_the_fewest_that_detect_its_difference(sd, m):
    n = seeds_for(sd, 0.05, m)
    assert detectable(sd, n, m) <= 0.05 < detectable(sd, n - 1, m)
    assert seeds_for(sd * 1.5, 0.05, m) > n


def test_a_seed_plan_reads_each_contrast_spread_from_an_earlier_sweep(tmp_path):
    r = tmp_path / "results"
    confirm_runs(r)
    h = analysis(hypotheses=HYPOTHESES).hypotheses
    plan = seed_plan(collect(r), h, 0.05, 0.05).set_index("name")
    d = (np.array([s[4] for s in SCORES.values()]) - np.array([s[3] for s in SCORES.values()])) / 2
    assert plan.loc["H1", "sd"] == pytest.approx(d.std(ddof=1))
    assert plan.loc["H1", "seeds"] == seeds_for(d.std(ddof=1), 0.05, 4)


def test_a_hypothesis_finding_in_prose_is_the_one_its_bundle_prints(tmp_path):
    """ "confirmed", "contradicted" and "undecided" judge the hypothesis quoted beside them: each must
    be the finding conclusions.md prints for it, in the family the sentence names."""
    from gmc.results.quotes import misjudged

    r = tmp_path / "published"
    confirm_runs(r)
    (r / "configs").mkdir()
    (r / "configs" / "analysis.yaml").write_text(yaml.safe_dump({"hypotheses": HYPOTHESES}))
    h1 = write_tables(r)["hypotheses"].set_index("name").loc["H1"]
    estimate = f"{h1['diff']:+.3f} [{h1['lo']:+.3f}, {h1['hi']:+.3f}]"
    doc = tmp_path / "page.md"
    page = "# Confirmation\n\n<!-- numbers from published -->\nIn the hypotheses family, GMC trails TIC by {e}: {w}.\n<!-- end numbers -->\n"
    doc.write_text(page.format(e=estimate, w="confirmed"))
    assert misjudged(doc) == []
    doc.write_text(page.format(e=estimate, w="undecided"))
    assert misjudged(doc) == [
        f'{doc}:4: "undecided" judges {estimate.replace("+", "")}, which published/tables/conclusions.md finds confirmed'
    ]
    doc.write_text(page.format(e=estimate, w="confirmed").replace("hypotheses family", "paired family"))
    assert (
        "in the paired family; published/tables/conclusions.md judges it in the hypotheses family" in misjudged(doc)[0]
    )


def test_plan_seeds_prints_each_hypothesis_and_the_seeds_the_study_needs(tmp_path, capsys):
    from gmc.cli import main

    r = tmp_path / "published"
    confirm_runs(r)
    preset = tmp_path / "confirm.yaml"
    preset.write_text(yaml.safe_dump({"analysis": {"hypotheses": HYPOTHESES}}))
    assert main(["plan-seeds", str(preset), str(r)]) == 0
    out = capsys.readouterr().out
    plan = seed_plan(collect(r), analysis(hypotheses=HYPOTHESES).hypotheses, 0.05, 0.05)
    assert f"| H1 | gmc@64 - tic@64 | 4 | {plan['diff'][0]:+.3f} | {plan['sd'][0]:.4f} | {plan['seeds'][0]} |" in out
    assert out.rstrip().endswith(f"seeds needed for every hypothesis: {plan['seeds'].max()}")
    preset.write_text("analysis: {}\n")
    assert main(["plan-seeds", str(preset), str(r)]) == 1
    assert "analysis.hypotheses: the preset states no hypotheses" in capsys.readouterr().err
