"""What the tables infer from the runs' frame (:func:`gmc.results.collect.collect`; method.md
section 7): means and 95% intervals over seeds (:func:`aggregate`), the paired differences of
estimators at equal (delay, G, seed) and each one's cost of staleness
(:func:`paired_differences`), their tests within each family, Holm-adjusted, with the
equivalence tests within the margin and the smallest difference a family detects (:func:`judge`,
:func:`family_detectable`), the league at the largest delay (:func:`league_ranking`), the
sweep's outcomes (:func:`outcomes`) and every verdict on them (:func:`conclusions`). Each returns
a tidy frame; the statistics themselves are :mod:`gmc.results.stats`', the text of the tables
:mod:`gmc.results.render`'s.
"""

from __future__ import annotations

import functools
import json
import math

import pandas as pd

from gmc.estimators import REGISTRY, SHARED_DIAGNOSTICS
from gmc.results.collect import (
    FINAL_REWARD,
    PROBLEMS,
    delay_key,
    score_columns,
    variant_estimators,
    with_benchmark_means,
)
from gmc.results.hypotheses import finding
from gmc.results.outputs import AnalysisConfig
from gmc.results.stats import (
    ALPHA,
    Interval,
    detectable,
    equivalence_p,
    holm,
    mean_interval,
    p_value,
    paired_difference,
    problem_paired_se,
    seeds_for,
)
from gmc.run.evaluate import SE
from gmc.sweep.points import is_fixed

PAIRS = (("gmc", "tic"), ("gmc", "grpo"), ("tic", "grpo"), ("gmc", "is"), ("gmc", "none"))
"""Paired comparisons ``a − b`` of the ``paired`` table: the paper's ordering GMC >= TIC >= GRPO,
and GMC against the uncapped and uncorrected references."""


def aggregate(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Per (algorithm, delay, group): ``:mean``, ``:std`` (over seeds), ``:lo``, ``:hi`` and
    ``:half`` (the 95% interval and its half-width) per column; ``n_seeds`` counts the seeds."""
    keys = ["algorithm", "delay", "group"]
    cols = [c for c in columns if c in frame.columns]
    rows = []
    for key, grp in frame.groupby(keys, sort=False):
        row = dict(zip(keys, key), n_seeds=len(grp))
        if "shared_with" in grp.columns and grp["shared_with"].notna().any():
            row["shared_with"] = grp["shared_with"].dropna().iloc[0]
        for col in cols:
            se = grp[col + SE] if col + SE in grp.columns else None
            iv = mean_interval(grp[col], se)
            row.update(
                {
                    f"{col}:mean": iv.mean,
                    f"{col}:std": iv.sd,
                    f"{col}:lo": iv.lo,
                    f"{col}:hi": iv.hi,
                    f"{col}:half": iv.half,
                }
            )
        rows.append(row)
    out = pd.DataFrame(rows)
    last = ["n_seeds", *(["shared_with"] if "shared_with" in out.columns else [])]
    return out[keys + [c for c in out.columns if c not in keys and c not in last] + last]


PAIRED_COLUMNS = [
    "comparison",
    "delay",
    "group",
    "metric",
    "diff",
    "lo",
    "hi",
    "half",
    "se",
    "n_seeds",
    "n_sign",
    "excludes_zero",
    "se_eval",
    "same_test_as",
]


ONE_RUN = "one run"
"""``same_test_as`` and ``verdict`` of a difference whose two sides are one run in every seed (a
shared run, :attr:`gmc.sweep.resolve.Sweep.shared`): zero by construction, not a test."""


PAIRED = "paired"
"""The family of the paired table's tests in one outcome (:func:`paired_tests`)."""
LEAGUE = "league"
"""The family of the league's tests in its score that the paired table does not hold
(:func:`judge_league`): each estimator against GMC where no pair of :data:`PAIRS` or variant
compares them."""


HYPOTHESES = "hypotheses"
"""The family of a confirmatory sweep's pre-registered hypotheses (``analysis.hypotheses``,
:func:`hypothesis_tests`)."""

HYPOTHESIS_COLUMNS = [
    "name",
    "contrast",
    "predict",
    "metric",
    "group",
    "diff",
    "lo",
    "hi",
    "half",
    "se",
    "n_seeds",
    "n_sign",
    "excludes_zero",
]


def hypothesis_tests(frame: pd.DataFrame, hypotheses, margin: float) -> pd.DataFrame:
    """The pre-registered ``hypotheses`` (:class:`gmc.results.hypotheses.Hypothesis`) tested in the
    primary outcome (:func:`outcomes`), one row each: the contrast's mean over the seeds that ran
    every cell, its 95% t-interval from the per-seed contrasts alone, seeds with the mean's sign;
    the family's tests, Holm-adjusted over the hypotheses (:func:`judge`, family
    :data:`HYPOTHESES`); and what they find of each prediction (``finding``,
    :func:`gmc.results.hypotheses.finding`). ``_runs`` holds the runs each seed's contrast
    combines (a difference of the paired table of the same runs is this test). A ValueError names
    a hypothesis whose cell the sweep did not run, or whose group size is not given where the
    sweep ran several."""
    frame = with_benchmark_means(frame)
    metric = outcomes(frame)[0][0]
    groups = sorted(set(frame["group"]))
    rows = []
    for h in hypotheses:
        group = h.group if h.group is not None else groups[0] if len(groups) == 1 else None
        if group is None:
            raise ValueError(f"hypothesis {h.name}: the sweep ran group sizes {groups}; name one (group)")
        sides = {1: [], -1: []}
        merged = None
        for i, ((algorithm, delay), c) in enumerate(h.cells.items()):
            cell = frame[(frame["algorithm"] == algorithm) & (frame["delay"] == delay) & (frame["group"] == group)]
            if cell.empty:
                raise ValueError(
                    f"hypothesis {h.name}: the sweep has no run of {algorithm} at delay {delay}, G = {group}"
                )
            cell = cell[["seed", "run_dir", metric]].rename(columns={"run_dir": f"run:{i}", metric: f"x:{i}"})
            merged = cell if merged is None else merged.merge(cell, on="seed")
            sides[1 if c > 0 else -1].append((i, abs(c)))
        plus = sum(merged[f"x:{i}"] * c for i, c in sides[1])
        minus = sum(merged[f"x:{i}"] * c for i, c in sides[-1])
        p = paired_difference(plus, minus)
        iv = p.interval
        runs = [c for c in merged.columns if c.startswith("run:")]
        rows.append(
            dict(
                name=h.name,
                contrast=h.contrast,
                predict=h.predict,
                metric=metric,
                group=group,
                diff=iv.mean,
                lo=iv.lo,
                hi=iv.hi,
                half=iv.half,
                se=iv.se,
                n_seeds=iv.n,
                n_sign=p.n_sign,
                excludes_zero=p.excludes_zero,
                _runs=frozenset(frozenset(r) for r in merged[runs].itertuples(index=False)),
            )
        )
    out = pd.DataFrame(rows, columns=[*HYPOTHESIS_COLUMNS, "_runs"])
    if out.empty:
        return out.assign(p=[], p_holm=[], p_equivalent=[], p_equivalent_holm=[], verdict=[], family=[], finding=[])
    out = judge(out, [], margin).assign(family=HYPOTHESES)
    out["finding"] = [finding(r.predict, r.diff, r.p_holm, r.p_equivalent_holm, ALPHA) for r in out.itertuples()]
    return out


def seed_plan(frame: pd.DataFrame, hypotheses, difference: float, margin: float) -> pd.DataFrame:
    """How many seeds a confirmatory sweep of ``hypotheses`` needs, planned from an earlier sweep's
    runs (``frame``): each hypothesis's contrast per seed there (:func:`hypothesis_tests`), its
    standard deviation over those seeds (``sd``), and the seeds at which the family detects
    ``difference`` at 80% power after Holm's adjustment (``seeds``,
    :func:`gmc.results.stats.seeds_for`)."""
    tests = hypothesis_tests(frame, hypotheses, margin)
    sd = tests["se"] * tests["n_seeds"] ** 0.5
    return pd.DataFrame(
        {
            "name": tests["name"],
            "contrast": tests["contrast"],
            "n_seeds": tests["n_seeds"],
            "diff": tests["diff"],
            "sd": sd,
            "seeds": [seeds_for(v, difference, len(tests)) for v in sd],
        }
    )


def paired_differences(
    frame: pd.DataFrame, pairs=PAIRS, margin: float = AnalysisConfig().equivalence_margin, hypotheses=()
) -> pd.DataFrame:
    """:func:`paired_tests` without the runs each row pairs: the paired table."""
    return paired_tests(frame, pairs, margin, hypotheses).drop(columns="_runs")


def paired_tests(
    frame: pd.DataFrame, pairs=PAIRS, margin: float = AnalysisConfig().equivalence_margin, hypotheses=()
) -> pd.DataFrame:
    """Paired differences, one row per (comparison, delay, group, metric): mean difference, 95%
    interval, its standard error, seeds paired, seeds with the mean's sign, and whether the
    interval excludes zero; then each family's (the table's differences in one metric) tests
    (:func:`judge`). Two kinds: ``a − b`` for each estimator pair (``pairs``, then each variant
    and its estimator, :func:`variant_pairs`) at equal (delay, group, seed),
    and the cost of staleness, ``A: stale − on-policy``, each estimator at every other delay
    against itself at delay 0 at equal (group, seed). Points where either side is missing are
    skipped. An evaluated score is paired per problem within a seed (:func:`_problem_paired_se`).

    A family holds each test once: a difference whose sides are one run in every seed (gmc − tic
    at delay 0, where gmc's run is tic's) is no test (``same_test_as`` :data:`ONE_RUN`), and one
    that pairs the same runs as an earlier difference (gmc − grpo and tic − grpo at delay 0) is
    that test again (``same_test_as`` names it) and takes its verdict without counting twice; so
    does one that pairs the runs of a pre-registered hypothesis (``hypotheses``,
    :func:`hypothesis_tests`) in its outcome (``same_test_as``: ``hypothesis <name>``), a test of
    the family :data:`HYPOTHESES`. Every other test is in the family :data:`PAIRED` of its metric
    (``family``); ``_runs`` holds the runs each row pairs (the league finds its tests here by them,
    :func:`judge_league`)."""
    frame = with_benchmark_means(frame)
    metrics = score_columns(frame)
    rows = []
    for a, b in [*pairs, *variant_pairs(frame)]:
        fa, fb = frame[frame["algorithm"] == a], frame[frame["algorithm"] == b]
        both = fa.merge(fb, on=["delay", "group", "seed"], suffixes=(":a", ":b"))
        rows += _difference_rows(f"{a} − {b}", both, metrics)
    for algorithm, runs in frame.groupby("algorithm", sort=False):
        on_policy = runs[runs["delay"] == "0"].drop(columns="delay")
        stale = runs[runs["delay"] != "0"]
        both = stale.merge(on_policy, on=["group", "seed"], suffixes=(":a", ":b"))
        rows += _difference_rows(f"{algorithm}: stale − on-policy", both, metrics)
    out = pd.DataFrame(rows, columns=[*PAIRED_COLUMNS, "_runs"])
    if out.empty:
        return out
    order = {c: i for i, c in enumerate(dict.fromkeys(out["comparison"]))}
    out["_c"] = out["comparison"].map(order)
    out = out.sort_values(["_c", "delay", "group"], key=delay_key, kind="stable").drop(columns="_c")
    out = out.reset_index(drop=True)
    held = (
        {(r["metric"], r["_runs"]): r for r in hypothesis_tests(frame, hypotheses, margin).to_dict("records")}
        if hypotheses
        else {}
    )
    first: dict = {}  # (metric, runs) -> the row of their first difference
    repeats: dict = {}  # row -> the earlier row whose test it is
    for i, r in out.iterrows():
        if r["same_test_as"] != ONE_RUN and r["_runs"] is not None:
            if (r["metric"], r["_runs"]) in held:
                out.at[i, "same_test_as"] = f"hypothesis {held[(r['metric'], r['_runs'])]['name']}"
                continue
            j = first.setdefault((r["metric"], r["_runs"]), i)
            if j != i:
                repeats[i] = j
                out.at[i, "same_test_as"] = f"{out.at[j, 'comparison']} at delay {out.at[j, 'delay']}"
    tests = out["same_test_as"] == ""
    judged = judge(out[tests].drop(columns="_runs"), ["metric"], margin).assign(family=PAIRED)
    added = [c for c in judged.columns if c not in out.columns]
    out = out.join(judged[added])
    out["verdict"] = out["verdict"].astype(object)
    for i, r in out.iterrows():  # a hypothesis' test is judged in its family
        h = held.get((r["metric"], r["_runs"]))
        if h is not None and r["same_test_as"] != ONE_RUN:
            out.loc[i, added] = [h[c] for c in added]
    for i, j in repeats.items():  # a repeated test takes its first difference's tests
        out.loc[i, added] = out.loc[j, added]
    out.loc[out["same_test_as"] == ONE_RUN, "verdict"] = ONE_RUN
    return out


def variant_pairs(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """``(variant, its estimator)`` for each variant in ``frame`` whose estimator ran too: a variant
    is compared with the estimator it varies (``gmc_tis − gmc``)."""
    present = set(frame["algorithm"])
    return [(a, e) for a, e in variant_estimators(frame).items() if e in present]


def _difference_rows(comparison: str, both: pd.DataFrame, metrics: list[str]) -> list[dict]:
    """Rows of :func:`paired_differences` for one comparison; ``both`` holds the paired runs side by
    side (columns ``<metric>:a`` and ``<metric>:b``)."""
    rows = []
    for (delay, group), grp in both.groupby(["delay", "group"], sort=False):
        # a run shared by both sides (gmc.sweep.resolve.Sweep.shared) is one evaluation: no noise between them
        one = grp["run_dir:a"] == grp["run_dir:b"] if "run_dir:a" in grp.columns else pd.Series(False, grp.index)
        runs = _runs(grp)
        for m in metrics:
            se_a = grp[f"{m}{SE}:a"].where(~one, 0.0) if f"{m}{SE}:a" in grp.columns else None
            se_b = grp[f"{m}{SE}:b"].where(~one, 0.0) if f"{m}{SE}:b" in grp.columns else None
            p = paired_difference(grp[f"{m}:a"], grp[f"{m}:b"], se_a, se_b, se_d=_problem_paired_se(grp, m))
            iv = p.interval
            rows.append(
                dict(
                    comparison=comparison,
                    delay=delay,
                    group=group,
                    metric=m,
                    diff=iv.mean,
                    lo=iv.lo,
                    hi=iv.hi,
                    half=iv.half,
                    se=iv.se,
                    n_seeds=iv.n,
                    n_sign=p.n_sign,
                    excludes_zero=p.excludes_zero,
                    se_eval=p.se_eval,
                    same_test_as=ONE_RUN if len(grp) and one.all() else "",
                    _runs=runs,
                )
            )
    return rows


def _runs(both: pd.DataFrame) -> frozenset | None:
    """The runs a difference pairs, whichever side each is on (two differences of the same runs
    are one test); None where the frame names no run directories."""
    if "run_dir:a" not in both.columns:
        return None
    return frozenset(frozenset(pair) for pair in zip(both["run_dir:a"], both["run_dir:b"]))


def _problem_paired_se(both: pd.DataFrame, metric: str):
    """Per paired seed, the evaluation standard error of the difference in ``metric`` paired per
    problem (:func:`gmc.results.stats.problem_paired_se`; for the mean over benchmarks, theirs
    combined as for independent benchmarks); None where a seed's two evaluations did not record
    their problems, or not the same ones (the unpaired error applies then)."""
    if not metric.startswith("eval/"):
        return None
    _, bench, key = metric.split("/")
    benches = (
        [bench]
        if bench != "mean"
        else sorted(
            {c.split("/")[1] for c in both.columns if c.startswith("eval/") and c.endswith(f"/{key}{PROBLEMS}:a")}
        )
    )
    if not benches:
        return None
    out = []
    for _, row in both.iterrows():
        ses = []
        for b in benches:
            a, c = row.get(f"eval/{b}/{key}{PROBLEMS}:a"), row.get(f"eval/{b}/{key}{PROBLEMS}:b")
            if not isinstance(a, tuple) or not isinstance(c, tuple) or a[0] != c[0] or len(a[1]) != len(c[1]):
                return None
            ses.append(problem_paired_se(a[1], c[1]))
        out.append(math.sqrt(sum(s * s for s in ses)) / len(ses))
    return out


def judge(table: pd.DataFrame, family: list[str], margin: float, prefix: str = "") -> pd.DataFrame:
    """Each difference's tests, with Holm's adjustment over its family (the rows that share the
    ``family`` columns): ``p`` (two-sided, ``diff = 0``), ``p_holm``, ``p_equivalent`` (two one-sided
    tests that ``|diff| < margin``), ``p_equivalent_holm`` and ``verdict``: ``resolved`` where
    ``p_holm < 0.05``, ``equivalent`` where ``p_equivalent_holm < 0.05``, else ``inconclusive``.
    ``prefix`` names the columns of one kind of difference in a wider table (``vs_gmc:``)."""
    table = table.copy()
    ivs = [_interval(r, prefix) for _, r in table.iterrows()]
    table[f"{prefix}p"] = [p_value(iv) for iv in ivs]
    table[f"{prefix}p_equivalent"] = [equivalence_p(iv, margin) for iv in ivs]
    for col in ("p", "p_equivalent"):
        adjusted = pd.Series(float("nan"), index=table.index)
        for _, grp in table.groupby(family, sort=False) if family else [(None, table)]:
            adjusted[grp.index] = holm(grp[f"{prefix}{col}"])
        table[f"{prefix}{col}_holm"] = adjusted
    table[f"{prefix}verdict"] = [
        verdict(p, e) for p, e in zip(table[f"{prefix}p_holm"], table[f"{prefix}p_equivalent_holm"])
    ]
    return table


def _interval(row, prefix: str) -> Interval:
    """The :class:`~gmc.results.stats.Interval` of a table row's difference (from its mean,
    standard error and seeds)."""
    n, se = int(row[f"{prefix}n_seeds"]), float(row[f"{prefix}se"])
    sd = se * math.sqrt(n) if n else math.nan
    return Interval(
        float(row[f"{prefix}diff"]),
        float(row[f"{prefix}lo"]),
        float(row[f"{prefix}hi"]),
        float(row[f"{prefix}half"]),
        n,
        sd,
        0.0,
    )


def verdict(p_holm: float, p_equivalent_holm: float) -> str:
    """``resolved``, ``equivalent`` or ``inconclusive`` from a difference's adjusted p-values."""
    if p_holm < ALPHA:
        return "resolved"
    if p_equivalent_holm < ALPHA:
        return "equivalent"
    return "inconclusive"


def family_detectable(table: pd.DataFrame, prefix: str = "") -> tuple[int, int, float]:
    """A family's size ``m``, its typical number of seeds ``n`` (the median) and the smallest
    difference it detects at 80% power after Holm's adjustment (:func:`gmc.results.stats.detectable`),
    from the root mean square of its differences' spread over seeds."""
    ok = table[table[f"{prefix}n_seeds"] >= 2]
    if f"{prefix}same_test_as" in ok.columns:  # each test once
        ok = ok[ok[f"{prefix}same_test_as"] == ""]
    if ok.empty:
        return len(table), 0, float("nan")
    sd = math.sqrt(float(((ok[f"{prefix}se"] ** 2) * ok[f"{prefix}n_seeds"]).mean()))
    n = int(ok[f"{prefix}n_seeds"].median())
    return len(ok), n, detectable(sd, n, len(ok))


LEAGUE_SCORE = ("eval/mean/pass_at_1", FINAL_REWARD)
"""The league's score: final Pass@1 (mean over benchmarks), or the final training reward where a
sweep evaluates nothing."""


def league_ranking(runs: pd.DataFrame, margin: float, hypotheses=()) -> pd.DataFrame:
    """Every estimator at the largest fixed delay (largest group size), ranked by final Pass@1:
    its mean and 95% interval over seeds, the paired difference to ``gmc`` and its cost of
    staleness (itself at that delay minus itself at delay 0) with their sign counts, each judged
    in its one family (:func:`judge_league`), and its own statistics (clipped, masked or capped
    fraction; ESS / G; shortfall), mean over training. No rows where the sweep has no fixed delay
    or no score."""
    frame = with_benchmark_means(runs)
    score = next((c for c in LEAGUE_SCORE if c in frame.columns), None)
    numeric = frame[frame["delay"].astype(str).map(is_fixed)]
    if score is None or numeric.empty:
        return pd.DataFrame(columns=["rank", "algorithm", "delay", "group"])
    delay = str(max(int(d) for d in numeric["delay"]))
    group = int(numeric["group"].max())
    point = numeric[(numeric["group"] == group)]
    at = point[point["delay"] == delay]
    se = score + SE

    def paired(a: pd.DataFrame, b: pd.DataFrame) -> dict:
        both = a.merge(b, on="seed", suffixes=(":a", ":b"))
        if both.empty:
            return dict(
                diff=float("nan"),
                lo=float("nan"),
                hi=float("nan"),
                half=float("nan"),
                se=float("nan"),
                n_seeds=0,
                n_sign=0,
                excludes_zero=False,
                _runs=None,
            )
        p = paired_difference(
            both[f"{score}:a"],
            both[f"{score}:b"],
            both.get(f"{se}:a"),
            both.get(f"{se}:b"),
            se_d=_problem_paired_se(both, score),
        )
        iv = p.interval
        return dict(
            diff=iv.mean,
            lo=iv.lo,
            hi=iv.hi,
            half=iv.half,
            se=iv.se,
            n_seeds=iv.n,
            n_sign=p.n_sign,
            excludes_zero=p.excludes_zero,
            _runs=_runs(both),
        )

    problems = [c for c in point.columns if c.endswith(PROBLEMS) and c.startswith("eval/")]
    keep = ["seed", "run_dir", score, *([se] if se in point.columns else []), *problems]
    gmc = at[at["algorithm"] == "gmc"][keep]
    rows = []
    for algorithm, grp in at.groupby("algorithm", sort=False):
        iv = mean_interval(grp[score], grp[se] if se in grp.columns else None)
        on_policy = point[(point["algorithm"] == algorithm) & (point["delay"] == "0")][keep]
        own = REGISTRY[algorithm].diagnostics if algorithm in REGISTRY else ()
        row = dict(
            algorithm=algorithm,
            delay=delay,
            group=group,
            score=score,
            mean=iv.mean,
            lo=iv.lo,
            hi=iv.hi,
            half=iv.half,
            n_seeds=iv.n,
            **{f"vs_gmc:{k}": v for k, v in paired(grp[keep], gmc.iloc[:0] if algorithm == "gmc" else gmc).items()},
            **{f"staleness_cost:{k}": v for k, v in paired(grp[keep], on_policy).items()},
            own_statistic=own[0] if own else "",
            own_value=float(grp[own[0]].mean()) if own and own[0] in grp.columns else float("nan"),
        )
        for col in SHARED_DIAGNOSTICS:
            row[col] = float(grp[col].mean()) if col in grp.columns else float("nan")
        rows.append(row)
    table = pd.DataFrame(rows).sort_values("mean", ascending=False, kind="stable").reset_index(drop=True)
    table.insert(0, "rank", range(1, len(table) + 1))
    tests = paired_tests(runs, margin=margin, hypotheses=hypotheses)
    return judge_league(table, margin, tests[tests["metric"] == score] if len(tests) else tests)


LEAGUE_KINDS = ("vs_gmc", "staleness_cost")
"""The league's two kinds of differences (columns ``<kind>:<column>``)."""
JUDGED = ("p", "p_holm", "p_equivalent", "p_equivalent_holm", "verdict", "family")
"""What :func:`judge_league` gives each of the league's differences."""


def judge_league(table: pd.DataFrame, margin: float, tests: pd.DataFrame) -> pd.DataFrame:
    """Each of the league's differences judged in its one family (``<kind>:family``): one that
    pairs the same runs as a test of the paired table (``tests``, :func:`paired_tests` in the
    league's score; a cost of staleness always, ``tic − gmc`` as ``gmc − tic``) is that test and
    takes its verdict in that test's family (:data:`PAIRED`, or :data:`HYPOTHESES` for a pre-registered one); the others (each estimator against GMC that no
    pair compares) form the family :data:`LEAGUE`, adjusted by Holm's method together
    (:func:`judge`). A difference of no paired seeds (GMC against itself) is in none."""
    long = pd.concat(
        [
            table[[c for c in table.columns if c.startswith(f"{k}:")]]
            .rename(columns=lambda c: c.split(":", 1)[1])
            .assign(kind=k, row=table.index)
            for k in LEAGUE_KINDS
        ],
        ignore_index=True,
    )
    held = {
        r["_runs"]: r
        for _, r in tests.iterrows()
        # a repeat is its first row's test; a hypothesis' is judged in its family
        if r["_runs"] is not None
        and (r["same_test_as"] in ("", ONE_RUN) or r["same_test_as"].startswith("hypothesis "))
    }
    found = [held.get(runs) if runs is not None else None for runs in long["_runs"]]
    own = [f is None and n > 0 for f, n in zip(found, long["n_seeds"])]
    judged = judge(long[own].drop(columns=["_runs"]), [], margin).assign(family=LEAGUE)
    long = long.drop(columns="_runs").astype({"n_seeds": int})
    out = pd.DataFrame({c: [float("nan")] * len(long) if c.startswith("p") else [""] * len(long) for c in JUDGED})
    out = out.astype({c: object for c in ("verdict", "family")})
    out.loc[judged.index, list(JUDGED)] = judged[list(JUDGED)].to_numpy()
    for i, f in enumerate(found):
        if f is not None:
            out.loc[i, list(JUDGED)] = [f[c] if not pd.isna(f[c]) else v for c, v in zip(JUDGED, out.loc[i])]
    long = pd.concat([long, out], axis=1)
    table = table.drop(columns=[f"{k}:_runs" for k in LEAGUE_KINDS])
    for k in LEAGUE_KINDS:
        part = long[long["kind"] == k].set_index("row")
        for col in JUDGED:
            table[f"{k}:{col}"] = part[col]
    return table


def outcomes(runs: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The sweep's outcomes as ``(column, role, label)``: Pass@1 over the benchmarks at the
    evaluation temperature, primary, and the final training reward at the sampling temperature,
    secondary; the training reward alone is primary where nothing was evaluated."""
    frame = with_benchmark_means(runs)

    def at(col: str) -> str:
        values = sorted(set(runs[col].dropna())) if col in runs.columns else []
        return f" (T = {', '.join(f'{v:g}' for v in values)})" if values else ""

    out = []
    if "eval/mean/pass_at_1" in frame.columns:
        out.append(("eval/mean/pass_at_1", "primary", f"Pass@1{at('eval_temperature')}"))
    out.append((FINAL_REWARD, "secondary" if out else "primary", f"train reward{at('train_temperature')}"))
    return out


CONCLUSION_COLUMNS = [
    "role",
    "outcome",
    "family",
    "comparison",
    "delay",
    "group",
    "diff",
    "lo",
    "hi",
    "n_seeds",
    "p_holm",
    "p_equivalent_holm",
    "verdict",
    "family_size",
    "detectable",
    "same_test_as",
    "finding",
]


def _family_rows(table: pd.DataFrame, name: str, **columns) -> pd.DataFrame:
    """A family's tests as rows of :func:`conclusions`: ``table``'s with the family's name, size and
    detectable difference (:func:`family_detectable`) and the given ``columns``."""
    m, _, mde = family_detectable(table)
    return table.assign(family=name, family_size=m, detectable=mde, **columns)[CONCLUSION_COLUMNS]


def conclusions(runs: pd.DataFrame, margin: float, hypotheses=()) -> pd.DataFrame:
    """Every test of the primary outcome's families (:data:`HYPOTHESES`, a confirmatory sweep's
    pre-registered ones, :func:`hypothesis_tests`; :data:`PAIRED`, the paired table's other tests;
    :data:`LEAGUE`, the league's tests the paired table does not hold), and of the secondary's,
    each in its one family, judged ``resolved``, ``equivalent`` within the margin or
    ``inconclusive`` after Holm's adjustment per family (:func:`judge`), each family with the
    smallest difference it detects at 80% power, each hypothesis with its ``finding``: what a
    document may say of the sweep, and what ``gmc compare-results`` judges a re-run by."""
    paired = paired_differences(runs, margin=margin, hypotheses=hypotheses)
    league = league_ranking(runs, margin, hypotheses)
    held = hypothesis_tests(runs, hypotheses, margin) if hypotheses else pd.DataFrame()
    parts = []
    for metric, role, label in outcomes(runs):
        family = functools.partial(_family_rows, role=role, outcome=label)
        if len(held) and held["metric"].iloc[0] == metric:
            parts.append(
                family(held, HYPOTHESES, comparison=held["name"] + ": " + held["contrast"], delay="-", same_test_as="")
            )
        fam = paired[(paired["metric"] == metric) & (paired["verdict"] != ONE_RUN)] if len(paired) else paired
        if len(fam):  # a hypothesis' test is listed in its own family
            fam = fam[~fam["same_test_as"].str.startswith("hypothesis ")]
        if len(fam):
            parts.append(family(fam, PAIRED, finding=""))
        if len(league) and league["score"].iloc[0] == metric:
            long = pd.concat(
                [
                    league[[c for c in league.columns if c.startswith(f"{k}:")]]
                    .rename(columns=lambda c: c.split(":", 1)[1])
                    .assign(
                        comparison=[
                            f"{a} − gmc" if k == "vs_gmc" else f"{a}: stale − on-policy" for a in league["algorithm"]
                        ]
                    )
                    for k in LEAGUE_KINDS
                ],
                ignore_index=True,
            )
            long = long[long["family"] == LEAGUE]
            delay, group = league["delay"].iloc[0], league["group"].iloc[0]
            parts.append(family(long, LEAGUE, delay=delay, group=group, same_test_as="", finding=""))
    if not parts:
        return pd.DataFrame(columns=CONCLUSION_COLUMNS)
    return pd.concat(parts, ignore_index=True)


TUNING_COLUMNS = [
    "estimator",
    "candidate",
    "settings",
    "delay",
    "group",
    "mean",
    "lo",
    "hi",
    "half",
    "n_seeds",
    "chosen",
]


def tuning_choices(runs: pd.DataFrame, tune: list[str]) -> pd.DataFrame:
    """Each tuned estimator's candidates (``analysis.tune``): the estimator and each of its
    variants in the sweep, at the largest fixed delay (largest group size), with the settings of
    its estimator that differ among the candidates (``settings``, JSON) and its mean primary score
    (Pass@1) with the 95% interval over seeds; ``chosen`` marks the one rule's choice, the highest
    mean (ties: the first candidate by name). A ValueError names an estimator the sweep did not
    run at that delay."""
    frame = with_benchmark_means(runs)
    metric = outcomes(frame)[0][0]
    fixed = frame[frame["delay"].astype(str).map(is_fixed)]
    if fixed.empty:
        raise ValueError("tuning chooses at the largest fixed delay, and the sweep ran none")
    delay = str(max(int(d) for d in fixed["delay"]))
    group = int(fixed["group"].max())
    at = fixed[(fixed["delay"] == delay) & (fixed["group"] == group)]
    estimators = variant_estimators(frame)
    rows = []
    for name in tune:
        names = sorted(a for a in set(at["algorithm"]) if a == name or estimators.get(a) == name)
        if not names:
            raise ValueError(f"analysis.tune names {name!r}, which the sweep did not run at delay {delay}, G = {group}")
        settings = {a: json.loads(at[at["algorithm"] == a]["estimator_settings"].iloc[0]) for a in names}
        varied = sorted(
            {k for s in settings.values() for k in s if len({json.dumps(t.get(k)) for t in settings.values()}) > 1}
        )
        candidates = []
        for a in names:
            iv = mean_interval(at[at["algorithm"] == a][metric])
            candidates.append(
                dict(
                    estimator=name,
                    candidate=a,
                    settings=json.dumps({k: settings[a][k] for k in varied}),
                    delay=delay,
                    group=group,
                    mean=iv.mean,
                    lo=iv.lo,
                    hi=iv.hi,
                    half=iv.half,
                    n_seeds=iv.n,
                )
            )
        best = max(range(len(candidates)), key=lambda i: (candidates[i]["mean"], -i))
        rows += [dict(c, chosen=i == best) for i, c in enumerate(candidates)]
    return pd.DataFrame(rows, columns=TUNING_COLUMNS)
