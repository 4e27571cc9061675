"""A re-run against a published bundle (``gmc compare-results``): every estimate, each published
conclusion held, weakened or failed, and the exit status (0 none failed, 1 a conclusion failed, 2
a file cannot be read)."""

import math

import pytest
from helpers import sweep

from gmc.cli import main
from gmc.results.compare import Conclusion, compare


def test_a_re_run_of_the_same_numbers_agrees_everywhere(bundle, tmp_path, capsys):
    comparison = compare(bundle, tmp_path / "results")
    assert comparison.checks and all(c.inside is not False for c in comparison.checks)
    resolved = [c.key for c in comparison.conclusions]
    assert "Pass@1 (T = 0.6) (primary, paired family): gmc − grpo at delay 16, G = 8" in resolved
    assert {c.kind for c in comparison.conclusions} <= {"resolved", "equivalent"}
    assert not comparison.failed and comparison.counts() == {"held": len(resolved), "weakened": 0, "failed": 0}
    with pytest.raises(SystemExit) as stop:
        main(["compare-results", str(bundle), str(tmp_path / "results")])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert (
        "0 of" in out
        and "one in twenty" in out
        and f"Of {len(resolved)} published conclusions: {len(resolved)} held, 0 weakened, 0 failed." in out
    )
    base = next(c for c in comparison.checks if c.key == "base/-/0 eval/synthetic/greedy")
    assert base.published_half > 0  # the base row has an interval: a base model per seed


def test_a_re_run_that_reverses_a_conclusion_exits_1(bundle, tmp_path, capsys):
    other = sweep(tmp_path / "other", scores={"gmc": (0.40, 0.45, 0.41), "grpo": (0.60, 0.64, 0.62)})
    comparison = compare(bundle, other)
    reversed_ = next(
        c
        for c in comparison.conclusions
        if c.key == "Pass@1 (T = 0.6) (primary, paired family): gmc − grpo at delay 16, G = 8"
    )
    assert reversed_.verdict == "failed: the sign changed" and comparison.failed
    assert comparison.counts()["failed"] >= 1
    assert any(c.inside is False for c in comparison.checks)
    with pytest.raises(SystemExit) as stop:
        main(["compare-results", str(bundle), str(other)])
    out = capsys.readouterr().out
    assert stop.value.code == 1 and "failed: the sign changed" in out and " failed." in out


def test_a_re_run_that_only_weakens_conclusions_exits_0(bundle, tmp_path, capsys):
    """Same signs, wider spread: resolved differences are no longer resolved, none reversed."""
    other = sweep(tmp_path / "other", scores={"gmc": (0.80, 0.55, 0.70), "grpo": (0.50, 0.54, 0.41)})
    comparison = compare(bundle, other)
    c = next(
        c
        for c in comparison.conclusions
        if c.key == "Pass@1 (T = 0.6) (primary, paired family): gmc − grpo at delay 16, G = 8"
    )
    assert c.verdict == "weakened: same sign, no longer resolved"
    assert comparison.counts() == {"held": 4, "weakened": 4, "failed": 0}
    with pytest.raises(SystemExit) as stop:
        main(["compare-results", str(bundle), str(other)])
    assert (
        stop.value.code == 0 and "Of 8 published conclusions: 4 held, 4 weakened, 0 failed." in capsys.readouterr().out
    )


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
        ((0.10, 0.02, 0.18), "resolved", "held: same sign, resolved again"),
        ((0.05, -0.01, 0.11), "inconclusive", "weakened: same sign, no longer resolved"),
        ((0.01, -0.01, 0.03), "inconclusive", "weakened: same sign, no longer resolved"),
        ((0.01, -0.01, 0.03), "equivalent", "failed: the re-run finds it equivalent within ±0.05"),
        ((-0.10, -0.18, -0.02), "resolved", "failed: the sign changed"),
        ((-0.01, -0.08, 0.06), "inconclusive", "failed: the sign changed"),
        (None, "inconclusive", "failed: not in the re-run"),
        ((math.nan, math.nan, math.nan), "inconclusive", "failed: the sign changed"),
    ],
)
def test_a_resolved_conclusion_is_held_weakened_or_failed(new, new_verdict, verdict):
    c = Conclusion("gmc − grpo", (0.12, 0.06, 0.18), new, new_verdict, margin=0.05)
    assert c.verdict == verdict and c.outcome == verdict.split(":")[0]


@pytest.mark.parametrize(
    "new,new_verdict,verdict",
    [
        ((0.01, -0.02, 0.04), "equivalent", "held: equivalent within ±0.05 again"),
        ((0.03, -0.03, 0.09), "inconclusive", "weakened: no longer shown equivalent, not resolved"),
        ((0.08, 0.04, 0.12), "resolved", "failed: the re-run resolves it"),
        (None, "inconclusive", "failed: not in the re-run"),
    ],
)
def test_an_equivalence_is_held_weakened_or_failed(new, new_verdict, verdict):
    c = Conclusion("gmc − tic", (0.00, -0.03, 0.03), new, new_verdict, kind="equivalent", margin=0.05)
    assert c.verdict == verdict and c.outcome == verdict.split(":")[0]
