"""Documents that quote a bundle: included files kept verbatim, every quoted number the bundle's."""

import json

import pytest

from gmc.cli import main
from gmc.results.bundles import PROVENANCE

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
    (bundle / PROVENANCE).write_text(json.dumps({"stages": {"wall_seconds": [4443.0], "rules": {
        "train": {"jobs": 2, "seconds": 10.0, "longest": 6.0}}}}))
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
    doc.write_text(DOC.format(cost=estimate.replace("-", "−"), sign=sign, lone=diff.lstrip("-"), lead=lead,
                              wall="74.0 min"))
    with pytest.raises(SystemExit) as stop:
        main(["quote-bundles", "--check", str(doc)])
    assert stop.value.code == 1 and "README.md:3: the block differs from published/tables/main.md" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["quote-bundles", str(doc)])
    assert stop.value.code == 0
    assert (bundle / "tables" / "main.md").read_text() in doc.read_text()
    with pytest.raises(SystemExit) as stop:
        main(["quote-bundles", "--check", str(doc)])
    assert stop.value.code == 0
    # a stale duration, a sign count, and intervals that belong to other estimates (a negative and a positive one)
    other = next(c for c in (0.2, 0.3, 0.5) if f"{c:.3f}" not in half)
    doc.write_text(doc.read_text().replace("74.0 min", "73.9 min").replace(f"({sign})", "(2/5)")
                   .replace(f"± {half}", f"± {other:.3f}").replace(f"{lead}", lead.replace(lead_half, "0.999")))
    with pytest.raises(SystemExit) as stop:
        main(["quote-bundles", "--check", str(doc)])
    err = capsys.readouterr().err
    assert stop.value.code == 1
    line = next(i for i, text in enumerate(doc.read_text().splitlines(), 1) if text.startswith("Staleness"))
    assert f"README.md:{line}: 2/5 is not a number of published" in err and f"README.md:{line + 1}: 73.9 min" in err
    assert f"README.md:{line}: {diff.lstrip('+')} ± {other:.3f} is not a number of published" in err
    assert f"README.md:{line}: {lead.lstrip('+').replace(lead_half, '0.999')} is not a number" in err
    assert err.count("is not a number") == 4  # the lone difference and the temperature are the bundle's
