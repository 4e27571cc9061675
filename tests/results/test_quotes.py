"""Documents that quote a bundle: included files kept verbatim, every quoted number the bundle's."""

import json

import pytest

from gmc.cli import main
from gmc.run.provenance import PROVENANCE

DOC = """# Results

<!-- include published/tables/main.md -->
stale
<!-- end include -->

<!-- numbers from published -->
Staleness costs grpo {cost} ({sign}), {lone} alone, at temperature 0.6; gmc leads by {lead};
the sweep took {wall}.
<!-- end numbers -->
"""


def test_a_document_quotes_a_bundle_only_through_its_files(bundle, tmp_path, capsys):
    """An included block is the bundle's file, rewritten from it; a number in a marked region that
    the bundle does not print (a hand-typed or stale one) fails, naming the document's line."""
    (bundle / "configs" / "eval.yaml").write_text("temperature: 0.6\n")
    (bundle / PROVENANCE).write_text(
        json.dumps(
            {"stages": {"wall_seconds": [4443.0], "rules": {"train": {"jobs": 2, "seconds": 10.0, "longest": 6.0}}}}
        )
    )
    main(["tables", "--results", str(bundle)])
    paired = (bundle / "tables" / "paired.md").read_text()
    cost = next(line for line in paired.splitlines() if line.startswith("| grpo: stale − on-policy | 16 | 8 |"))
    cell = cost.split(" | ")[5]  # synthetic Pass@1, e.g. "-0.050 ± 0.035 (3/3) *"
    estimate, sign = cell.split(" (")[0], cell.split("(")[1].split(")")[0]
    diff, half = estimate.split(" ± ")
    ahead = next(line for line in paired.splitlines() if line.startswith("| gmc − grpo | 16 | 8 |"))
    lead = ahead.split(" | ")[5].split(" (")[0]  # a positive estimate, e.g. "+0.200 ± 0.043"
    lead_half = lead.split(" ± ")[1]
    doc = tmp_path / "README.md"
    doc.write_text(
        DOC.format(cost=estimate.replace("-", "−"), sign=sign, lone=diff.lstrip("-"), lead=lead, wall="74.0 min")
    )
    with pytest.raises(SystemExit) as stop:
        main(["quote-bundles", "--check", str(doc)])
    assert (
        stop.value.code == 1
        and "README.md:3: the block differs from published/tables/main.md" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as stop:
        main(["quote-bundles", str(doc)])
    assert stop.value.code == 0
    assert (bundle / "tables" / "main.md").read_text() in doc.read_text()
    with pytest.raises(SystemExit) as stop:
        main(["quote-bundles", "--check", str(doc)])
    assert stop.value.code == 0
    # a stale duration, a sign count, and intervals that belong to other estimates (a negative and a positive one)
    other = next(c for c in (0.2, 0.3, 0.5) if f"{c:.3f}" not in half)
    doc.write_text(
        doc.read_text()
        .replace("74.0 min", "73.9 min")
        .replace(f"({sign})", "(2/5)")
        .replace(f"± {half}", f"± {other:.3f}")
        .replace(f"{lead}", lead.replace(lead_half, "0.999"))
    )
    with pytest.raises(SystemExit) as stop:
        main(["quote-bundles", "--check", str(doc)])
    err = capsys.readouterr().err
    assert stop.value.code == 1
    line = next(i for i, text in enumerate(doc.read_text().splitlines(), 1) if text.startswith("Staleness"))
    assert f"README.md:{line}: 2/5 is not a number of published" in err and f"README.md:{line + 1}: 73.9 min" in err
    assert f"README.md:{line}: {diff.lstrip('+')} ± {other:.3f} is not a number of published" in err
    assert f"README.md:{line}: {lead.lstrip('+').replace(lead_half, '0.999')} is not a number" in err
    assert err.count("is not a number") == 4  # the lone difference and the temperature are the bundle's


VERDICTS = """# Results

<!-- numbers from published -->
GMC leads GRPO by +0.200 [+0.175, +0.225], resolved; staleness costs grpo −0.050 ± 0.000 in
Pass@1, {word}; gmc has no cost in training reward (+0.000 [+0.000, +0.000]). Resolved:
−0.050 [−0.050, −0.050]. A gradient's bias of 0.125 [0.102, 0.143] is inconclusive.
<!-- end numbers -->
"""


def test_a_verdict_word_in_prose_is_the_one_the_bundles_conclusions_give(bundle, tmp_path, capsys):
    """ "resolved", "not resolved", "inconclusive", "equivalent" and "no cost" in a region that
    quotes a bundle judge the difference quoted beside them (its interval in brackets or as
    ± half): where conclusions.md judges that difference otherwise, ``gmc quote-bundles --check``
    fails naming the line; a difference conclusions.md does not judge is not checked."""
    from gmc.results.quotes import misjudged

    main(["tables", "--results", str(bundle)])
    assert (
        "grpo: stale − on-policy at delay 16, G = 8: -0.050 [-0.050, -0.050], 3 seeds, p_holm 0.000: **resolved**"
        in (bundle / "tables" / "conclusions.md").read_text()
    )
    doc = tmp_path / "results.md"
    doc.write_text(VERDICTS.format(word="resolved"))
    assert misjudged(doc) == []
    doc.write_text(VERDICTS.format(word="inconclusive"))
    assert misjudged(doc) == [
        f'{doc}:5: "inconclusive" judges -0.050 ± 0.000, which published/tables/conclusions.md finds resolved'
    ]
    with pytest.raises(SystemExit) as stop:
        main(["quote-bundles", "--check", str(doc)])
    assert stop.value.code == 1 and f'{doc}:5: "inconclusive" judges' in capsys.readouterr().err
    doc.write_text(
        VERDICTS.format(word="resolved")
        .replace("has no cost", "has a resolved cost")
        .replace("A gradient's", "Inconclusive: +0.200 [+0.175, +0.225]. A gradient's")
    )
    assert [p.split(": ", 1)[1] for p in misjudged(doc)] == [
        '"resolved" judges 0.000 [0.000, 0.000], which published/tables/conclusions.md finds equivalent',
        '"Inconclusive" judges 0.200 [0.175, 0.225], which published/tables/conclusions.md finds resolved',
    ]


def test_a_verdict_word_comes_from_the_family_its_sentence_names(bundle, tmp_path):
    """Each test is in one family of conclusions.md (a ``## ... family`` section); a sentence that
    names a family ("the league's family", "the paired table") judges the difference there: a
    verdict of a difference that family does not hold is named, with the family that holds it."""
    from gmc.results.quotes import misjudged, verdicts

    main(["tables", "--results", str(bundle)])
    assert {t[4] for t in verdicts(bundle)} == {"paired"}
    doc = tmp_path / "results.md"
    text = VERDICTS.format(word="resolved")
    doc.write_text(text.replace("GMC leads", "In the paired table's family GMC leads"))
    assert misjudged(doc) == []
    doc.write_text(text.replace("GMC leads", "In the league's family GMC leads"))
    found = misjudged(doc)
    assert found[0] == (
        f'{doc}:4: "resolved" judges 0.200 [0.175, 0.225] in the league family; '
        "published/tables/conclusions.md judges it in the paired family"
    )
    assert len(found) == 3  # the sentence's every verdict word: "resolved", "resolved", "no cost"
    # a sentence naming no family: any family's verdict; the next sentence does not inherit the name
    doc.write_text(text.replace("Resolved:", "Not the league table. Resolved:"))
    assert misjudged(doc) == []
