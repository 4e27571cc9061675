"""A re-run against a published bundle (``gmc compare-results``): every estimate, each resolved
conclusion, and the exit status (0 holds, 1 a conclusion fails, 2 a file cannot be read)."""

import math

import pytest
from helpers import sweep

from gmc.cli import main
from gmc.results.compare import Conclusion, compare


def test_a_re_run_of_the_same_numbers_agrees_everywhere(bundle, tmp_path, capsys):
    comparison = compare(bundle, tmp_path / "results")
    assert comparison.checks and all(c.inside is not False for c in comparison.checks)
    resolved = [c.key for c in comparison.conclusions]
    assert "Pass@1 (T = 0.6) (primary, paired table): gmc − grpo at delay 16, G = 8" in resolved
    assert {c.kind for c in comparison.conclusions} <= {"resolved", "equivalent"}
    assert comparison.holds
    with pytest.raises(SystemExit) as stop:
        main(["compare-results", str(bundle), str(tmp_path / "results")])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert (
        "0 of" in out
        and "one in twenty" in out
        and f"{len(resolved)} of {len(resolved)} published conclusions hold" in out
    )
    base = next(c for c in comparison.checks if c.key == "base/-/0 eval/synthetic/greedy")
    assert base.published_half > 0  # the base row has an interval: a base model per seed


def test_a_re_run_that_reverses_a_conclusion_exits_1(bundle, tmp_path, capsys):
    other = sweep(tmp_path / "other", scores={"gmc": (0.40, 0.45, 0.41), "grpo": (0.60, 0.64, 0.62)})
    comparison = compare(bundle, other)
    reversed_ = next(
        c
        for c in comparison.conclusions
        if c.key == "Pass@1 (T = 0.6) (primary, paired table): gmc − grpo at delay 16, G = 8"
    )
    assert reversed_.verdict == "does not hold: the sign changed" and not comparison.holds
    assert any(c.inside is False for c in comparison.checks)
    with pytest.raises(SystemExit) as stop:
        main(["compare-results", str(bundle), str(other)])
    assert stop.value.code == 1 and "does not hold" in capsys.readouterr().out


def test_an_unreadable_bundle_or_results_folder_exits_2_naming_the_file(bundle, tmp_path, capsys):
    for args, named in (
        ([str(tmp_path / "nothing"), str(tmp_path / "results")], "nothing/provenance.json"),
        ([str(bundle), str(tmp_path / "empty")], "empty/train"),
    ):
        (tmp_path / "empty").mkdir(exist_ok=True)
        with pytest.raises(SystemExit) as stop:
            main(["compare-results", *args])
        assert stop.value.code == 2 and named in capsys.readouterr().err
    (bundle / "tables" / "paired.csv").write_text("")
    with pytest.raises(SystemExit) as stop:
        main(["compare-results", str(bundle), str(tmp_path / "results")])
    assert stop.value.code == 2 and "paired.csv" in capsys.readouterr().err


@pytest.mark.parametrize(
    "new,new_verdict,verdict",
    [
        ((0.10, 0.02, 0.18), "resolved", "holds: same sign, resolved again"),
        ((0.05, -0.01, 0.11), "inconclusive", "holds: same sign, not resolved, overlaps the published interval"),
        (
            (0.01, -0.01, 0.03),
            "inconclusive",
            "does not hold: same sign but unresolved and outside the published interval",
        ),
        ((-0.10, -0.18, -0.02), "resolved", "does not hold: the sign changed"),
        (None, "inconclusive", "not in the re-run: cannot be checked"),
        ((math.nan, math.nan, math.nan), "inconclusive", "does not hold: the sign changed"),
    ],
)
def test_a_resolved_conclusion_holds_when_its_sign_stays_and_it_is_resolved_or_overlaps(new, new_verdict, verdict):
    c = Conclusion("gmc − grpo", (0.12, 0.06, 0.18), new, new_verdict)
    assert c.verdict == verdict and c.holds == verdict.startswith("holds")


@pytest.mark.parametrize(
    "new,new_verdict,verdict",
    [
        ((0.01, -0.02, 0.04), "equivalent", "holds: equivalent again"),
        ((0.03, -0.03, 0.09), "inconclusive", "holds: not shown equivalent, but within the margin and overlapping"),
        ((0.08, 0.04, 0.12), "resolved", "does not hold: outside the margin ±0.05 or the published interval"),
        ((0.02, 0.10, 0.14), "inconclusive", "does not hold: outside the margin"),
    ],
)
def test_an_equivalence_holds_when_the_re_run_stays_within_the_margin(new, new_verdict, verdict):
    c = Conclusion("gmc − tic", (0.00, -0.03, 0.03), new, new_verdict, kind="equivalent", margin=0.05)
    assert c.verdict.startswith(verdict) and c.holds == verdict.startswith("holds")
