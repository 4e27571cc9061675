"""How the tables read (method.md section 7): the frames of :mod:`gmc.results.inference` as the
files show them, Markdown (pipe tables, and the notes and lists of verdicts that open the paired
and conclusions tables), LaTeX (booktabs tabulars) and HTML (a standalone page of the Markdown,
with its inline style), in a :class:`Rendered` table. Cells read ``mean ± half-width`` of the 95%
interval over seeds, differences ``diff ± half (sign count)`` with ``*`` where resolved and ``≈``
where equivalent; columns take readable names (:func:`pretty`) and estimators their registry's
labels.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass

import pandas as pd

from gmc.estimators import REGISTRY, SHARED_DIAGNOSTICS
from gmc.results.collect import FINAL_REWARD
from gmc.results.inference import HYPOTHESES, LEAGUE, PAIRED, family_detectable
from gmc.results.outputs import AnalysisConfig
from gmc.results.stats import ALPHA, LEVEL, POWER


@dataclass(frozen=True)
class Rendered:
    """A table as the files show it: the tidy frame (CSV), Markdown and LaTeX; HTML is the Markdown's."""

    frame: pd.DataFrame
    markdown: str
    latex: str

    def html(self, title: str) -> str:
        return markdown_html(self.markdown, title)


MARKS = {"resolved": " *", "equivalent": " ≈", "inconclusive": ""}
"""How a cell shows a difference's verdict."""


def _signed(diff, half, n_sign, n, verdict, family="") -> str:
    if pd.isna(diff):
        return "-"
    cell = f"{diff:+.3f}" if pd.isna(half) else f"{diff:+.3f} ± {half:.3f}"
    return f"{cell} ({n_sign}/{n}){MARKS.get(verdict, '')}{HELD if family == PAIRED else ''}"


HELD = " †"
"""How the league marks a difference that is a test of the paired table, judged in its family."""


def league_display(table: pd.DataFrame) -> pd.DataFrame:
    """The league as the Markdown and LaTeX files show it; ``*`` resolved, ``≈`` equivalent within
    the margin, each after Holm's adjustment over its family, ``†`` where that family is the
    paired table's (:func:`gmc.results.inference.judge_league`)."""
    name = pretty(table["score"].iloc[0]) if len(table) else "score"
    labels = [REGISTRY[a].label if a in REGISTRY else a for a in table["algorithm"]]
    out = pd.DataFrame({"rank": table["rank"], "estimator": labels})
    out[f"{name} at delay {table['delay'].iloc[0]}"] = [
        f"{_fmt(m, h)} [{lo:.3f}, {hi:.3f}]" if not pd.isna(lo) else _fmt(m, h)
        for m, h, lo, hi in zip(table["mean"], table["half"], table["lo"], table["hi"])
    ]
    for key, title in (("vs_gmc", "− GMC (sign)"), ("staleness_cost", "cost of staleness (sign)")):
        out[title] = [
            _signed(*r)
            for r in zip(
                table[f"{key}:diff"],
                table[f"{key}:half"],
                table[f"{key}:n_sign"],
                table[f"{key}:n_seeds"],
                table[f"{key}:verdict"],
                table[f"{key}:family"],
            )
        ]
    out["own statistic"] = [
        f"{s.removeprefix('ratio/')} {v:.3f}" if s and not pd.isna(v) else "-"
        for s, v in zip(table["own_statistic"], table["own_value"])
    ]
    for col in SHARED_DIAGNOSTICS:
        out[col.removeprefix("ratio/")] = ["-" if pd.isna(v) else f"{v:.3f}" for v in table[col]]
    out["seeds"] = table["n_seeds"]
    return out


def league_note(margin: float) -> str:
    """The league's legend: its cells and what the marks beside an interval say."""
    return (
        f"Mean ± half-width [95% interval] over seeds; differences: mean ± half-width (seeds with the "
        f"mean's sign / seeds paired), * resolved (Holm-adjusted p < {ALPHA} over the difference's family), "
        f"≈ equivalent within ±{margin} (adjusted likewise). Each difference is one test in one family: "
        f"† marks a test of the paired table (the same runs; every cost of staleness), judged in its "
        f"family ({PAIRED}); the others form the league's family ({LEAGUE}). "
        f"{UNADJUSTED.replace('printed beside it', 'in tables/conclusions.md')}"
    )


def judged_differences(paired: pd.DataFrame, which: str) -> list[str]:
    """One sentence per paired difference of verdict ``which`` (``resolved``, ``equivalent``)."""
    return [
        f"{r.comparison} at delay {r.delay}, G = {r.group}, {pretty(r.metric)}: {r.diff:+.3f} "
        f"[{r.lo:+.3f}, {r.hi:+.3f}], sign in {r.n_sign}/{r.n_seeds} seeds, p_holm {r.p_holm:.3f}"
        + _same_test(r.same_test_as)
        for r in paired.itertuples()
        if r.verdict == which
    ]


def _same_test(same_test_as) -> str:
    """`` (the same runs as ...)`` for a difference that pairs the runs of an earlier one."""
    return f" (the same runs as {same_test_as})" if isinstance(same_test_as, str) and same_test_as else ""


def _bracketed(table: pd.DataFrame) -> list[str]:
    """Each row's difference with its 95% interval, ``+0.100 [+0.050, +0.150]`` (the mean alone
    where it has none)."""
    return [
        f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" if not pd.isna(lo) else _fmt(d, float("nan"))
        for d, lo, hi in zip(table["diff"], table["lo"], table["hi"])
    ]


def conclusions_display(table: pd.DataFrame) -> pd.DataFrame:
    out = table[["outcome", "family", "comparison", "delay", "group"]].copy()
    out["difference [95% interval]"] = _bracketed(table)
    out["seeds"] = table["n_seeds"]
    out["p (Holm)"] = ["-" if pd.isna(p) else f"{p:.3f}" for p in table["p_holm"]]
    out["verdict"] = table["verdict"]
    return out


def conclusions_markdown(table: pd.DataFrame, margin: float) -> str:
    """The conclusions as a document: per family its size and detectable difference, then its
    differences with their verdicts."""
    lines = [
        f"Every test of the sweep's outcomes, judged within its one family ({PAIRED}: the paired "
        f"table's differences in one outcome, each test counted once; {LEAGUE}: the league's "
        f"differences the paired table does not hold): **resolved** where Holm's adjusted p < {ALPHA}, **equivalent "
        f"within ±{margin}** where two one-sided tests, adjusted likewise, place it inside the margin, "
        f"**inconclusive** otherwise. Intervals: {LEVEL:.0%} t-intervals of the per-seed differences "
        f"(their spread over seeds holds the evaluation noise; evaluated scores paired per problem). {UNADJUSTED}",
        "",
    ]
    if (table["family"] == HYPOTHESES).any():
        lines[0] += (
            f" The {HYPOTHESES} family holds a confirmatory sweep's pre-registered hypotheses, each also "
            "**confirmed**, **contradicted** or **undecided** as its prediction states (tables/hypotheses.md)."
        )
    for (role, outcome, name), fam in table.groupby(["role", "outcome", "family"], sort=False):
        lines += [
            f"## {outcome}, {role}: {name} family",
            "",
            f"{fam['family_size'].iloc[0]} test{'s' if fam['family_size'].iloc[0] != 1 else ''}; the smallest detectable at {POWER:.0%} power after "
            f"adjustment: {detectable_text(fam['detectable'].iloc[0])}.",
            "",
        ]
        for r in fam.itertuples():
            words = {
                "resolved": "resolved",
                "equivalent": f"equivalent within ±{margin}",
                "inconclusive": "inconclusive",
            }[r.verdict]
            estimate = f"{r.diff:+.3f} [{r.lo:+.3f}, {r.hi:+.3f}]" if not pd.isna(r.lo) else f"{r.diff:+.3f}"
            where = f", G = {r.group}" if name == HYPOTHESES else f" at delay {r.delay}, G = {r.group}"
            found = f"; as predicted: **{r.finding}**" if name == HYPOTHESES else ""
            lines.append(
                f"- {r.comparison}{where}: {estimate}, {r.n_seeds} seeds, "
                f"p_holm {r.p_holm:.3f}: **{words}**{found}{_same_test(r.same_test_as)}"
            )
        lines.append("")
    if table.empty:
        lines.append("No differences: the sweep compares nothing.")
    return "\n".join(lines).rstrip() + "\n"


def _fmt(mean, half) -> str:
    if pd.isna(mean):
        return "-"
    return f"{mean:.3f}" if pd.isna(half) else f"{mean:.3f} ± {half:.3f}"


def algorithm_labels(table: pd.DataFrame) -> list[str]:
    """Each row's algorithm; a run trained once for several estimators is shown under each, the
    sharing one marked ``gmc (run of tic)``."""
    if "shared_with" not in table.columns:
        return list(table["algorithm"])
    return [a if pd.isna(w) else f"{a} (run of {w})" for a, w in zip(table["algorithm"], table["shared_with"])]


def _display(table: pd.DataFrame) -> pd.DataFrame:
    """``mean ± half-width`` cells (95% interval over seeds) with readable headers."""
    out = table[["algorithm", "delay", "group"]].copy()
    out["algorithm"] = algorithm_labels(table)
    for col in table.columns:
        if col.endswith(":mean"):
            name = col[: -len(":mean")]
            out[pretty(name)] = [_fmt(m, h) for m, h in zip(table[col], table[f"{name}:half"])]
    out["seeds"] = table["n_seeds"]
    return out


def paired_display(paired: pd.DataFrame) -> pd.DataFrame:
    """One row per (comparison, delay, group); cells ``diff ± half (sign count)``, ``*`` resolved
    and ``≈`` equivalent (:func:`gmc.results.inference.judge`)."""
    rows = []
    for (comp, delay, group), grp in paired.groupby(["comparison", "delay", "group"], sort=False):
        row = {"comparison": comp, "delay": delay, "group": group}
        for r in grp.itertuples():
            row[pretty(r.metric)] = _signed(r.diff, r.half, r.n_sign, r.n_seeds, r.verdict)
        rows.append(row)
    return pd.DataFrame(rows)


def pretty(name: str) -> str:
    if name == FINAL_REWARD:
        return "train reward"
    if name.startswith("eval/"):
        _, bench, key = name.split("/")
        return f"{bench} {'greedy' if key == 'greedy' else 'Pass@1'}"
    return name


def markdown_table(shown: pd.DataFrame) -> str:
    header = "| " + " | ".join(shown.columns) + " |"
    sep = "|" + "|".join("---" for _ in shown.columns) + "|"
    lines = ["| " + " | ".join(str(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    return "\n".join([header, sep, *lines]) + "\n"


def latex_table(shown: pd.DataFrame) -> str:
    def esc(x):
        return str(x).replace("_", r"\_").replace("±", r"$\pm$").replace("−", "$-$").replace("~", r"\textasciitilde{}")

    cols = "l" * 3 + "r" * (len(shown.columns) - 3)
    lines = [
        rf"\begin{{tabular}}{{{cols}}}",
        r"\toprule",
        " & ".join(esc(c) for c in shown.columns) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(esc(v) for v in row) + r" \\" for row in shown.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


_HTML_STYLE = (
    "body{font:14px/1.45 system-ui,sans-serif;margin:1.2em;color:#1e293b}"
    "table{border-collapse:collapse;margin:.6em 0}th,td{padding:.25em .6em;border-bottom:1px solid #cbd5e1;"
    "white-space:nowrap}th{text-align:left;background:#f1f5f9}td:not(:first-child){text-align:right}"
    "p,li{max-width:60em}"
)


def _inline_html(text: str) -> str:
    """Escaped text with Markdown's ``**strong**`` and ```code``` spans."""
    out = html.escape(text, quote=False)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def markdown_html(markdown: str, title: str) -> str:
    """A standalone HTML page of the Markdown the tables write (headings, paragraphs, bullet
    lists, pipe tables, strong and code spans): what the HTML report shows inline."""
    body, lines, i = [], markdown.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level + 1}>{_inline_html(line[level:].strip())}</h{level + 1}>")
            i += 1
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            head, rest = rows[0], [r for r in rows[1:] if not all(set(c) <= set("-: ") for c in r)]
            body.append(
                "<table><thead><tr>" + "".join(f"<th>{_inline_html(c)}</th>" for c in head) + "</tr></thead>"
                "<tbody>"
                + "".join("<tr>" + "".join(f"<td>{_inline_html(c)}</td>" for c in r) + "</tr>" for r in rest)
                + "</tbody></table>"
            )
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline_html(lines[i][2:])}</li>")
                i += 1
            body.append("<ul>" + "".join(items) + "</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("#", "|", "- ")):
                para.append(lines[i])
                i += 1
            body.append(f"<p>{_inline_html(' '.join(para))}</p>")
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_HTML_STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def to_markdown(table: pd.DataFrame) -> str:
    return markdown_table(_display(table))


def to_latex(table: pd.DataFrame) -> str:
    return latex_table(_display(table))


UNADJUSTED = (
    "An interval is the difference's own, not adjusted for its family; its verdict follows the "
    "Holm-adjusted p printed beside it, so an interval that excludes 0 can still be inconclusive."
)
"""What every table that prints a verdict beside an interval says of the pair."""


def detectable_text(mde: float) -> str:
    """The smallest detectable difference as printed: ``±0.123``, or why there is none (no
    difference with two seeds has an interval)."""
    return "none (fewer than two seeds: no interval)" if pd.isna(mde) else f"±{mde:.3f}"


PAIRED_NOTE = (
    f"Paired differences at equal (delay, G, seed), and each estimator's cost of staleness "
    "(A: stale − on-policy, the estimator at the row's delay minus itself at delay 0, equal G "
    f"and seed): mean ± half-width of the {LEVEL:.0%} t-interval of the per-seed differences "
    "(their spread over seeds holds the evaluation noise; evaluated scores paired per problem), "
    "(seeds with the mean's sign / seeds paired). "
    f"The table's differences in one outcome are a family ({PAIRED}), each test counted once (a difference "
    "of one shared run is none, two of the same runs are one): * resolved (Holm-adjusted p < "
    f"{ALPHA}), ≈ equivalent within ±{{margin}} (two one-sided tests, adjusted likewise). {UNADJUSTED}"
)


def paired_markdown(paired: pd.DataFrame, margin: float = AnalysisConfig().equivalence_margin) -> str:
    lines = [PAIRED_NOTE.format(margin=margin), ""]
    for which in ("resolved", "equivalent"):
        found = judged_differences(paired, which) if len(paired) else []
        lines += [f"{which.capitalize()} differences:", ""]
        lines += [f"- {s}" for s in found] if found else ["- none"]
        lines.append("")
    if len(paired):
        lines += [f"Smallest difference each family detects at {POWER:.0%} power (after adjustment):", ""]
        for metric, grp in paired.groupby("metric", sort=False):
            m, n, mde = family_detectable(grp)
            lines.append(f"- {pretty(metric)}: {m} tests, {n} seeds: {detectable_text(mde)}")
        lines.append("")
    return "\n".join(lines) + "\n" + (markdown_table(paired_display(paired)) if len(paired) else "")


def hypotheses_display(table: pd.DataFrame) -> pd.DataFrame:
    out = table[["name", "contrast", "predict", "group"]].copy()
    out["difference [95% interval]"] = _bracketed(table)
    out["sign"] = [f"{s}/{n}" for s, n in zip(table["n_sign"], table["n_seeds"])]
    out["p_holm"] = [f"{p:.3f}" for p in table["p_holm"]]
    out["p_equivalent_holm"] = [f"{p:.3f}" for p in table["p_equivalent_holm"]]
    out["test"] = table["verdict"]
    out["finding"] = table["finding"]
    return out


def hypotheses_markdown(table: pd.DataFrame, margin: float) -> str:
    """The hypotheses as a document: how they are judged, the family's size and detectable
    difference, then one row each."""
    m, n, mde = family_detectable(table) if len(table) else (0, 0, float("nan"))
    note = (
        f"The pre-registered hypotheses, one family of {m} tests in the primary outcome ({n} seeds; the "
        f"smallest difference it detects at {POWER:.0%} power after adjustment: {detectable_text(mde)}). Each "
        f"contrast is taken per seed; its {LEVEL:.0%} t-interval is that of the per-seed contrasts. Tests: "
        f"difference from zero and equivalence within ±{margin} (two one-sided tests), each Holm-adjusted "
        f"over the family. A predicted sign is **confirmed** where the difference is resolved (p_holm < "
        f"{ALPHA}) with that sign, **contradicted** where it is resolved with the other sign or is "
        f"equivalent to zero, **undecided** otherwise; a predicted equivalence is **confirmed** where the "
        f"equivalence is resolved, **contradicted** where the difference is resolved and the equivalence "
        f"is not, **undecided** otherwise. {UNADJUSTED}"
    )
    return note + "\n\n" + markdown_table(hypotheses_display(table))


TUNING_NOTE = (
    "Each tuned estimator's candidates (itself and its variants) at the largest delay: mean Pass@1 "
    "± half-width [95% interval] over the tuning seeds; the rule, fixed before the run, chooses the "
    "highest mean (✓), written to tuned.yaml."
)


def tuning_display(table: pd.DataFrame) -> pd.DataFrame:
    out = table[["estimator", "candidate"]].copy()
    out["settings"] = [", ".join(f"{k} {v}" for k, v in json.loads(s).items()) or "-" for s in table["settings"]]
    out["delay"] = table["delay"]
    out["group"] = table["group"]
    out["Pass@1"] = [
        f"{_fmt(m, h)} [{lo:.3f}, {hi:.3f}]" if not pd.isna(lo) else _fmt(m, h)
        for m, h, lo, hi in zip(table["mean"], table["half"], table["lo"], table["hi"])
    ]
    out["seeds"] = table["n_seeds"]
    out["chosen"] = ["✓" if c else "" for c in table["chosen"]]
    return out
