"""The tables built from run directories: means and intervals over seeds, the base model per
seed, shared runs, paired differences, and points parsed back from paths."""

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
from helpers import fake_run

from gmc.results.collect import base_scores, collect
from gmc.results.render import to_latex, to_markdown
from gmc.results.tables import write_tables


def test_tables_aggregate_seeds(tmp_path):
    r = tmp_path / "results"
    fake_run(r, "gmc", 16, 8, 0, 0.5, 0.4)
    fake_run(r, "gmc", 16, 8, 1, 0.7, 0.6)
    fake_run(r, "grpo", 0, 8, 0, 0.3, 0.2)
    fake_run(r, "grpo", "latency", 8, 0, 0.1, 0.1)
    frame = collect(r)
    assert list(frame["delay"]) == ["16", "16", "0", "latency"]
    tables = write_tables(r)
    main = tables["main"]
    row = main[(main.algorithm == "gmc")].iloc[0]
    assert row["rollout/reward_mean_last20:mean"] == pytest.approx(0.6)
    sd = pd.Series([0.5, 0.7]).std()
    assert row["rollout/reward_mean_last20:std"] == pytest.approx(sd)
    assert row["rollout/reward_mean_last20:half"] == pytest.approx(12.7062047 * sd / math.sqrt(2))
    assert row["eval/mean/greedy:mean"] == pytest.approx(0.5) and row["n_seeds"] == 2
    # greedy: binomial standard error over the 101 problems, folded into the interval
    se = [math.sqrt(p * (1 - p) / 100) for p in (0.4, 0.6)]
    half = 12.7062047 * math.sqrt((sd**2 + (se[0] ** 2 + se[1] ** 2) / 2) / 2)
    assert row["eval/synthetic/greedy:half"] == pytest.approx(half)
    assert row["eval/mean/greedy:half"] == pytest.approx(half)
    md = to_markdown(main)
    assert "0.600 ± 1.271" in md and "synthetic Pass@1" in md
    grpo = main[main.algorithm == "grpo"].iloc[0]  # one seed: a mean, no interval
    assert grpo["n_seeds"] == 1 and math.isnan(grpo["eval/synthetic/pass_at_1:half"])
    assert r"$\pm$" in to_latex(main)
    assert (r / "tables" / "main.csv").exists() and (r / "tables" / "diagnostics.tex").exists()


def test_a_base_model_per_seed_gives_the_base_row_an_interval(tmp_path):
    r = tmp_path / "results"
    fake_run(r, "gmc", 0, 8, 0, 0.5, 0.4)
    for seed, score in enumerate((0.30, 0.36, 0.42)):
        d = r / "eval" / "base" / f"seed~{seed}"
        d.mkdir(parents=True)
        (d / "synthetic.json").write_text(json.dumps({"benchmark": "synthetic", "greedy": score, "problems": 101}))
    assert list(base_scores(r)["seed"]) == [0, 1, 2]
    base = write_tables(r)["main"].iloc[0]
    assert base["algorithm"] == "base" and base["n_seeds"] == 3
    se = [math.sqrt(p * (1 - p) / 100) for p in (0.30, 0.36, 0.42)]
    half = 4.30265273 * math.sqrt((0.06**2 + sum(x**2 for x in se) / 3) / 3)
    assert base["eval/synthetic/greedy:mean"] == pytest.approx(0.36)
    assert base["eval/synthetic/greedy:half"] == pytest.approx(half)
    runs = write_tables(r)["runs"]  # what the interval is made of: one row per seed, base models first
    assert [(a, s) for a, s in zip(runs["algorithm"], runs["seed"])] == [
        ("base", 0),
        ("base", 1),
        ("base", 2),
        ("gmc", 0),
    ]
    assert list(runs["eval/synthetic/greedy"]) == pytest.approx([0.30, 0.36, 0.42, 0.4])
    assert "| base | - | 0 | 1 | - | 0.360 | - | 0.360 | - |" in (r / "tables" / "runs.md").read_text()
    # one base model for every seed (a hub model): one row, no interval
    shutil.rmtree(r / "eval" / "base")
    (r / "eval" / "base").mkdir()
    (r / "eval" / "base" / "synthetic.json").write_text(
        json.dumps({"benchmark": "synthetic", "greedy": 0.3, "problems": 101})
    )
    base = write_tables(r)["main"].iloc[0]
    assert base["algorithm"] == "base" and base["n_seeds"] == 1 and math.isnan(base["eval/synthetic/greedy:half"])


def test_a_shared_run_appears_under_both_names_and_differs_from_itself_by_exactly_zero(tmp_path):
    r = tmp_path / "results"
    for seed, score in enumerate((0.40, 0.55, 0.47)):
        fake_run(r, "gmc", 0, 8, seed, score, score, se=0.02)
        tic = r / "train" / "algo~tic" / "delay~0" / "group~8" / f"seed~{seed}"
        tic.mkdir(parents=True)
        (tic / "shared.json").write_text(json.dumps({"run": f"algo~gmc/delay~0/group~8/seed~{seed}"}))
    frame = collect(r)
    assert sorted(frame["algorithm"]) == ["gmc"] * 3 + ["tic"] * 3
    assert set(frame.loc[frame.algorithm == "tic", "shared_with"]) == {"gmc"}
    tables = write_tables(r)
    row = tables["paired"][
        (tables["paired"].comparison == "gmc − tic") & (tables["paired"].metric == "eval/synthetic/pass_at_1")
    ].iloc[0]
    assert row["diff"] == 0 and row["half"] == 0  # one evaluation: no evaluation noise between them
    assert "tic (run of gmc)" in (r / "tables" / "main.md").read_text()


def test_a_family_counts_each_test_once(tmp_path):
    """With tic's on-policy run shared by gmc: gmc − tic at delay 0 is one run, no test (no
    p-value, verdict 'one run', not among the conclusions); tic − grpo at delay 0 pairs the same
    runs as gmc − grpo there, so it is that test again, with its p-values; Holm's adjustment
    runs over the distinct tests alone, by hand."""
    from gmc.results.inference import ONE_RUN
    from gmc.results.stats import holm

    r = tmp_path / "results"
    for seed, (t0, p0, g, t, p) in enumerate(
        [(0.60, 0.50, 0.40, 0.58, 0.36), (0.66, 0.52, 0.50, 0.62, 0.38), (0.62, 0.58, 0.46, 0.64, 0.44)]
    ):
        fake_run(r, "tic", 0, 8, seed, t0, t0, se=0.01)
        gmc = r / "train" / "algo~gmc" / "delay~0" / "group~8" / f"seed~{seed}"
        gmc.mkdir(parents=True)
        (gmc / "shared.json").write_text(json.dumps({"run": f"algo~tic/delay~0/group~8/seed~{seed}"}))
        fake_run(r, "grpo", 0, 8, seed, p0, p0, se=0.01)
        for algo, score in (("gmc", g), ("tic", t), ("grpo", p)):
            fake_run(r, algo, 64, 8, seed, score, score, se=0.01)
    paired = write_tables(r)["paired"]
    fam = paired[paired.metric == "eval/synthetic/pass_at_1"].set_index(["comparison", "delay"])
    one = fam.loc[("gmc − tic", "0")]
    assert one["same_test_as"] == ONE_RUN and one["verdict"] == ONE_RUN and math.isnan(one["p_holm"])
    again, first = fam.loc[("tic − grpo", "0")], fam.loc[("gmc − grpo", "0")]
    assert again["same_test_as"] == "gmc − grpo at delay 0" and first["same_test_as"] == ""
    assert (again["p"], again["p_holm"], again["verdict"]) == (first["p"], first["p_holm"], first["verdict"])
    tests = fam[fam["same_test_as"] == ""]
    assert len(tests) == 9 - 2  # 3 pairs x 2 delays + 3 costs of staleness, less the one run and the repeat
    assert list(tests["p_holm"]) == pytest.approx(list(holm(tests["p"])))
    conclusions = pd.read_csv(r / "tables" / "conclusions.csv", keep_default_na=False)
    primary = conclusions[(conclusions.role == "primary") & (conclusions.family == "paired")]
    assert ONE_RUN not in set(primary["verdict"]) and set(primary["family_size"]) == {7}
    md = (r / "tables" / "conclusions.md").read_text()
    assert "7 tests; the smallest detectable" in md and "(the same runs as gmc − grpo at delay 0)" in md
    # the league's differences are all tests of the paired table: each keeps its one verdict there
    league = pd.read_csv(r / "tables" / "league.csv", keep_default_na=False, dtype={"delay": str}).set_index(
        "algorithm"
    )
    mean = paired[paired.metric == "eval/mean/pass_at_1"].set_index(["comparison", "delay"])
    for algorithm, pair in (("tic", "gmc − tic"), ("grpo", "gmc − grpo")):
        assert league.loc[algorithm, "vs_gmc:family"] == "paired"
        assert float(league.loc[algorithm, "vs_gmc:p_holm"]) == pytest.approx(mean.loc[(pair, "64"), "p_holm"])
        assert league.loc[algorithm, "vs_gmc:verdict"] == mean.loc[(pair, "64"), "verdict"]
    for algorithm in ("gmc", "tic", "grpo"):
        cost = mean.loc[(f"{algorithm}: stale − on-policy", "64")]
        assert league.loc[algorithm, "staleness_cost:family"] == "paired"
        assert (
            float(league.loc[algorithm, "staleness_cost:p_holm"]),
            league.loc[algorithm, "staleness_cost:verdict"],
        ) == (
            pytest.approx(cost["p_holm"]),
            cost["verdict"],
        )
    assert set(conclusions["family"]) == {"paired"}  # no test of the league's own
    assert "† |" in (r / "tables" / "league.md").read_text()


def test_a_league_test_the_paired_table_lacks_is_in_the_league_family_alone(tmp_path):
    """icepop − gmc pairs runs no paired difference pairs (no pair of PAIRS, no variant): the
    league's family holds it alone, so its adjusted p is its own; grpo − gmc and every cost of
    staleness are tests of the paired family, judged there once; the conclusions list each test
    once, under its family, the paired family Holm-adjusted over its own tests."""
    from gmc.results.stats import holm

    r = tmp_path / "results"
    scores = {"gmc": (0.6, 0.5), "grpo": (0.55, 0.40), "icepop": (0.6, 0.45)}
    for seed in range(4):
        for algo, (on, stale) in scores.items():
            fake_run(r, algo, 0, 8, seed, on, on + 0.01 * seed, se=0.01)
            fake_run(r, algo, 64, 8, seed, stale, stale + 0.013 * seed**2, se=0.01)
    tables = write_tables(r)
    league = tables["league"].set_index("algorithm")
    assert league.loc["icepop", "vs_gmc:family"] == "league" and league.loc["grpo", "vs_gmc:family"] == "paired"
    assert league.loc["gmc", "vs_gmc:family"] == "" and (league["staleness_cost:family"] == "paired").all()
    assert league.loc["icepop", "vs_gmc:p_holm"] == pytest.approx(league.loc["icepop", "vs_gmc:p"])  # one test
    conclusions = tables["conclusions"]
    own = conclusions[(conclusions.role == "primary") & (conclusions.family == "league")]
    assert list(own["comparison"]) == ["icepop − gmc"] and set(own["family_size"]) == {1}
    primary = conclusions[conclusions.role == "primary"]
    assert not primary.duplicated(["comparison", "delay", "group"]).any()  # each test in one family
    paired = primary[primary.family == "paired"]
    ps = tables["paired"].query("metric == 'eval/mean/pass_at_1' and same_test_as == ''")["p"]
    assert sorted(paired["p_holm"]) == pytest.approx(sorted(holm(ps)))
    assert "## Pass@1, primary: league family\n\n1 test;" in (r / "tables" / "conclusions.md").read_text()


def test_a_results_folder_without_runs_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no finished runs"):
        collect(tmp_path)


def test_paired_differences_at_equal_delay_group_and_seed(tmp_path):
    r = tmp_path / "results"
    for seed, (g, t, p) in enumerate([(0.70, 0.50, 0.60), (0.72, 0.60, 0.66), (0.74, 0.52, 0.70)]):
        fake_run(r, "gmc", 16, 8, seed, 0.5, g, se=0.02)
        fake_run(r, "tic", 16, 8, seed, 0.5, t, se=0.02)
        fake_run(r, "grpo", 16, 8, seed, 0.5, p, se=0.02)
    fake_run(r, "gmc", 0, 8, 1, 0.5, 0.9)  # on-policy partner of gmc's seed 1 only
    fake_run(r, "tic", 16, 4, 0, 0.5, 0.7)  # no partner: skipped
    paired = write_tables(r)["paired"]
    assert list(dict.fromkeys(paired["comparison"])) == [
        "gmc − tic",
        "gmc − grpo",
        "tic − grpo",
        "gmc: stale − on-policy",
    ]
    assert set(zip(paired["delay"], paired["group"])) == {("16", 8)}
    stale = paired[(paired.comparison == "gmc: stale − on-policy") & (paired.metric == "eval/synthetic/pass_at_1")]
    assert len(stale) == 1 and stale.iloc[0]["n_seeds"] == 1  # seed 1 alone is paired
    assert stale.iloc[0]["diff"] == pytest.approx((0.72 - 0.9) / 2)
    row = paired[(paired.comparison == "tic − grpo") & (paired.metric == "eval/synthetic/pass_at_1")].iloc[0]
    assert row["diff"] == pytest.approx(((0.50 - 0.60) + (0.60 - 0.66) + (0.52 - 0.70)) / 6)
    row = paired[(paired.comparison == "gmc − tic") & (paired.metric == "eval/synthetic/pass_at_1")].iloc[0]
    d = [(0.70 - 0.50) / 2, (0.72 - 0.60) / 2, (0.74 - 0.52) / 2]  # pass_at_1 = score / 2
    half = 4.30265273 * math.sqrt(pd.Series(d).var() / 3)  # the seeds' spread alone
    assert row["diff"] == pytest.approx(sum(d) / 3) and row["half"] == pytest.approx(half)
    assert row["se_eval"] == pytest.approx(math.sqrt(2) * 0.02)  # reported: both evaluations' noise
    assert row["n_seeds"] == 3 and row["n_sign"] == 3 and row["excludes_zero"]
    row = paired[(paired.comparison == "gmc − grpo") & (paired.metric == "eval/synthetic/pass_at_1")].iloc[0]
    assert row["n_sign"] == 3 and not row["excludes_zero"]
    reward = paired[paired.metric == "rollout/reward_mean_last20"]
    assert (reward["diff"] == 0).all() and not reward["excludes_zero"].any()
    # the family of synthetic Pass@1: three tests (the one-seed difference has no p-value), Holm by hand
    fam = paired[paired.metric == "eval/synthetic/pass_at_1"].set_index("comparison")
    ps = fam["p"].dropna().sort_values()
    assert list(fam["p_holm"].dropna().sort_values()) == pytest.approx(
        [3 * ps.iloc[0], max(3 * ps.iloc[0], 2 * ps.iloc[1]), max(3 * ps.iloc[0], 2 * ps.iloc[1], ps.iloc[2])]
    )
    # gmc − tic: the unadjusted interval excludes zero, the adjusted test does not resolve it
    assert fam.loc["gmc − tic", "excludes_zero"] and fam.loc["gmc − tic", "p"] < 0.05
    assert fam.loc["gmc − tic", "p_holm"] > 0.05 and fam.loc["gmc − tic", "verdict"] == "inconclusive"
    md = (r / "tables" / "paired.md").read_text()
    assert "Resolved differences:\n\n- none" in md and "(3/3) |" in md and "(3/3) *" not in md
    assert "synthetic Pass@1: 3 tests, 3 seeds: ±" in md
    assert "$-$" in (r / "tables" / "paired.tex").read_text()
    assert len(pd.read_csv(r / "tables" / "paired.csv")) == len(paired)


def test_evaluated_differences_are_paired_per_problem_and_judged_in_the_conclusions(tmp_path):
    """Two estimators evaluated on the same 40 problems: each seed's difference in Pass@1 gets the
    error of its per-problem differences (0.05 wherever they differ by 0.5 on a tenth of the
    problems), not the unpaired one; conclusions.md names each difference's verdict and its
    family's detectable difference."""
    r = tmp_path / "results"
    base = [2, 0, 1, 2] * 10
    moved = [c + (1 if i < 4 else 0) for i, c in enumerate([0, 0, 1, 1] * 10)]  # 4 problems gain a sample
    for seed in range(3):
        fake_run(
            r,
            "gmc",
            8,
            4,
            seed,
            0.5,
            0.6,
            se=0.1,
            correct=[min(2, c + (1 if i < 4 else 0)) for i, c in enumerate(base)],
        )
        fake_run(r, "tic", 8, 4, seed, 0.5, 0.4, se=0.1, correct=base)
        fake_run(r, "grpo", 8, 4, seed, 0.5, 0.4 + 0.02 * seed, se=0.1, correct=moved)
    paired = write_tables(r)["paired"]
    row = paired[(paired.comparison == "gmc − tic") & (paired.metric == "eval/synthetic/pass_at_1")].iloc[0]
    d = np.array([min(2, c + (1 if i < 4 else 0)) - c for i, c in enumerate(base)]) / 2
    paired_se = d.std(ddof=1) / math.sqrt(40)
    assert row["se_eval"] == pytest.approx(paired_se) and row["se"] == 0  # paired noise reported; no seed spread
    assert paired_se < math.sqrt(2) * 0.1 / 3
    conclusions = pd.read_csv(r / "tables" / "conclusions.csv")
    assert set(conclusions["role"]) == {"primary", "secondary"} and set(conclusions["family"]) == {"paired"}
    assert set(conclusions["verdict"]) <= {"resolved", "equivalent", "inconclusive"}
    md = (r / "tables" / "conclusions.md").read_text()
    assert "## Pass@1, primary: paired family" in md and "smallest detectable at 80% power" in md
    assert "gmc − tic at delay 8, G = 4: +0.100" in md


def test_a_tables_html_page_is_its_markdown():
    """Headings, paragraphs (lines joined), lists, pipe tables (the separator row dropped), strong
    and code spans, everything else escaped."""
    from gmc.results.render import markdown_html

    page = markdown_html(
        "Note: p < 0.05 is **resolved**\nin `paired`.\n\n## Pass@1\n\n- a & b\n- c\n\n"
        "| algorithm | score |\n|---|---|\n| gmc | 0.5 ± 0.1 |\n",
        "main: scores",
    )
    body = page.split("<body>\n", 1)[1]
    assert body == (
        "<h1>main: scores</h1>\n"
        "<p>Note: p &lt; 0.05 is <strong>resolved</strong> in <code>paired</code>.</p>\n"
        "<h3>Pass@1</h3>\n"
        "<ul><li>a &amp; b</li><li>c</li></ul>\n"
        "<table><thead><tr><th>algorithm</th><th>score</th></tr></thead>"
        "<tbody><tr><td>gmc</td><td>0.5 ± 0.1</td></tr></tbody></table>\n</body></html>\n"
    )


def test_a_variant_is_compared_with_its_estimator(tmp_path):
    """A variant's runs (their config names the estimator it varies) are paired with that
    estimator's at equal delay, group and seed: ``gmc_tis − gmc``."""
    r = tmp_path / "results"
    for seed, (g, v) in enumerate([(0.50, 0.60), (0.52, 0.66), (0.48, 0.62)]):
        fake_run(r, "gmc", 16, 8, seed, 0.5, g)
        fake_run(r, "gmc_tis", 16, 8, seed, 0.5, v)
        (r / "train" / "algo~gmc_tis" / "delay~16" / "group~8" / f"seed~{seed}" / "config.yaml").write_text(
            "algorithm: gmc\n"
        )
    frame = collect(r)
    assert set(frame[frame.algorithm == "gmc_tis"]["estimator"]) == {"gmc"}
    paired = write_tables(r)["paired"]
    row = paired[(paired.comparison == "gmc_tis − gmc") & (paired.metric == "eval/synthetic/greedy")].iloc[0]
    assert row["diff"] == pytest.approx(((0.60 - 0.50) + (0.66 - 0.52) + (0.62 - 0.48)) / 3)


def test_a_point_of_one_seed_warns_and_prints_no_nan(caplog):
    """The gradient lab's bundle trains one point on one seed: the tables say it has no interval."""
    from helpers import REPO

    from gmc.results.render import detectable_text
    from gmc.results.tables import make_tables

    with caplog.at_level("WARNING", logger="gmc.results.tables"):
        tables = make_tables(REPO / "published" / "gradient_lab")
    assert "1 of 1 points have fewer than two seeds: their cells have no interval" in caplog.text
    assert not any("nan" in t.markdown for t in tables.values())
    assert detectable_text(float("nan")) == "none (fewer than two seeds: no interval)"
    assert detectable_text(0.1234) == "±0.123"
