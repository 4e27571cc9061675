"""Published results: a bundle, the folder that redraws a sweep's tables and figures with no
training, and its archive.

A bundle (``published/default/`` for the default run) is a results folder without checkpoints,
models or completions: per run its ``summary.json``, ``config.yaml``, ``run.json`` (or
``shared.json``), its per-step curves reduced to what the figures read
(:data:`FIGURE_FIELDS`), every evaluation's scores, the resolved configuration (the runs'
``config.yaml``, ``configs/`` of the evaluation and the base models), the tables and figures,
the gradient lab's tables where the sweep ran it, and :data:`PROVENANCE` (the commit, the
machine, the thread counts the runs recorded, what the stale runs' groups record of being
trained again, :func:`stale_groups`).
``gmc report --results <bundle>`` redraws its tables and figures from it alone.
:func:`export_results` packs the same bundle into one ``.tar.gz`` to carry it elsewhere, and
:func:`import_results` unpacks it into a results folder.
Given Snakemake's logs of the sweep's run, a bundle records its time per stage
(:mod:`gmc.results.stages`). A re-run is judged against a bundle by :mod:`gmc.results.compare`.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import tarfile
import tempfile
from pathlib import Path

from gmc.io import atomic_dir, atomic_path, read_jsonl, write_json, write_text
from gmc.results.outputs import LAB_FOLDER
from gmc.results.stages import stage_times, stages_markdown
from gmc.results.tables import write_tables
from gmc.run.provenance import PROVENANCE, git_revision, package_versions
from gmc.run.rundir import CONFIG, GROUPS, INFO, METRICS, SHARED, SUMMARY
from gmc.sweep.points import Point

RUN_FILES = (SUMMARY, CONFIG, INFO, SHARED)
"""Files of a run directory the bundle keeps whole."""

FIGURE_FIELDS = {METRICS: ("step", "rollout/reward_mean"), GROUPS: ("step", "staleness", "length_max")}
"""Per-step logs the bundle keeps, reduced to the fields the figures read (:mod:`gmc.results.figures`):
the reward curve of every run, the groups' staleness and length of the runs under a named
delay mode (a fixed delay's staleness is the delay)."""


def machine() -> dict:
    """The processor, its vector extensions, cores and the system: what moves float rounding."""
    info = {"system": platform.platform(), "machine": platform.machine(), "cores": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            info["processor"] = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
            info["vector"] = sorted(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "fma"))
            break
    return info


def _threads(results: Path, bundle: Path) -> dict:
    """The thread counts the runs trained with (their ``run.json``) and the base models were built
    with (``models/**/build_summary.json``), as they recorded them."""

    def recorded(paths):
        found = sorted({json.loads(p.read_text()).get("threads") for p in paths} - {None})
        return found or "not recorded"

    return {
        "train": recorded((bundle / "train").glob(f"**/{INFO}")),
        "build": recorded((results / "models").glob("**/build_summary.json")),
    }


def base_models(results: Path) -> dict:
    """Each locally built base model's warm start as its build recorded it: the seed it was built
    from, its greedy accuracy, and, under an acceptance rule, every attempt and whether the seed's
    model replaces a rejected one (reported, never hidden)."""
    out = {}
    for path in sorted((results / "models").glob("**/build_summary.json")):
        s = json.loads(path.read_text())
        out[str(path.parent.relative_to(results))] = {
            k: s[k] for k in ("seed", "steps", "greedy_accuracy", "attempts", "replaced") if k in s
        }
    return out


def stale_groups(bundle: Path) -> dict:
    """What the bundle's stale runs (every delay but a fixed 0) record of the groups they trained
    (their ``summary.json``): how many runs, how many groups, how many of those an earlier update
    had trained already (``reused``: none when each batch is trained once), and how many runs
    predate the count (``not_recorded``)."""
    out = {"runs": 0, "groups": 0, "reused": 0, "not_recorded": 0}
    for path in sorted((bundle / "train").glob(f"**/seed~*/{SUMMARY}")):
        if Point.parse(path.parent).delay.fixed == 0:
            continue
        summary = json.loads(path.read_text())
        out["runs"] += 1
        if "async/groups_reused" not in summary:
            out["not_recorded"] += 1
            continue
        out["groups"] += summary["async/groups"]
        out["reused"] += summary["async/groups_reused"]
    return out


STAGES = "stages.md"
"""The bundle's time per stage as a Markdown table (from :data:`PROVENANCE`'s ``stages``)."""


def write_stages(bundle: str | Path) -> None:
    """Write :data:`STAGES` from the bundle's provenance, where it records its stages."""
    stages = recorded_stages(bundle)
    if stages:
        write_text(Path(bundle) / STAGES, stages_markdown(stages))


def recorded_stages(results: str | Path) -> list | None:
    """The time per stage a results folder records in its own :data:`PROVENANCE` (one unpacked from
    a bundle by :func:`import_results`), else None."""
    provenance = Path(results) / PROVENANCE
    return json.loads(provenance.read_text()).get("stages") if provenance.exists() else None


def publish(results: str | Path, bundle: str | Path, logs: list[str | Path] = ()) -> int:
    """Write the bundle of the finished sweep in ``results`` to ``bundle`` (replaced whole, atomically)
    with its tables and, given Snakemake's ``logs`` of its run, its time per stage
    (:func:`stage_times`), else the stages ``results`` itself records (a folder unpacked from a
    bundle); returns the number of files. Figures are drawn into it by ``gmc report``."""
    results = Path(results)
    if not (results / "train").is_dir():
        raise FileNotFoundError(f"{results}/train: not a results folder of a finished sweep")
    stages = stage_times(list(logs)) if logs else recorded_stages(results)
    with atomic_dir(bundle) as tmp:
        for run in sorted((results / "train").glob("**/seed~*")):
            if Point.find(run) is None or not ((run / SUMMARY).exists() or (run / SHARED).exists()):
                continue
            out = tmp / run.relative_to(results)
            out.mkdir(parents=True)
            for name in RUN_FILES:
                if (run / name).exists():
                    shutil.copy2(run / name, out / name)
            named = not Point.parse(run).delay.is_fixed
            for name, keep in FIGURE_FIELDS.items():
                if (run / name).exists() and (name != GROUPS or named):
                    rows = [{k: r[k] for k in keep if k in r} for r in read_jsonl(run / name)]
                    (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        for path in sorted((results / "eval").glob("**/*.json")):
            (tmp / path.relative_to(results)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, tmp / path.relative_to(results))
        lab = results / LAB_FOLDER
        if (lab / "gradients.csv").exists():
            (tmp / LAB_FOLDER).mkdir()
            for path in lab.iterdir():
                if path.suffix in (".csv", ".md", ".json"):
                    shutil.copy2(path, tmp / LAB_FOLDER / path.name)
        if (results / "configs").is_dir():  # the runs' own config.yaml are their resolved train configs
            shutil.copytree(results / "configs", tmp / "configs", ignore=shutil.ignore_patterns("train"))
        commits = sorted(
            {json.loads(p.read_text()).get("git_revision", "unknown") for p in (tmp / "train").glob(f"**/{INFO}")}
        )
        write_json(
            tmp / PROVENANCE,
            {
                "commit": commits[0] if len(commits) == 1 else commits,
                "published_with": git_revision(),
                "made": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "machine": machine(),
                "threads": _threads(results, tmp),
                "packages": package_versions(),
                "python": platform.python_version(),
                "from": str(results),
                "base_models": base_models(results),
                "stale_groups": stale_groups(tmp),
                **({"stages": stages} if stages else {}),
            },
        )
        write_tables(tmp)
        write_stages(tmp)
        count = sum(1 for p in tmp.rglob("*") if p.is_file())
    return count


def export_results(results: str | Path, archive: str | Path, logs: list[str | Path] = ()) -> int:
    """The bundle of ``results`` (:func:`publish`, its time per stage from Snakemake's ``logs``)
    packed into the ``.tar.gz`` ``archive`` (written atomically); returns the number of files."""
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle"
        count = publish(results, bundle, logs)
        with atomic_path(archive) as out, tarfile.open(out, "w:gz") as tar:
            for path in sorted(bundle.rglob("*")):
                if path.is_file():
                    tar.add(path, arcname=str(path.relative_to(bundle)))
    return count


def import_results(archive: str | Path, results: str | Path) -> int:
    """Unpack an archive made by :func:`export_results` under ``results``; returns the number of
    files. An archive that is not a bundle (not a gzip-compressed tar, or without the bundle's
    provenance, runs or tables) is refused before anything is written, naming it and what it
    lacks; so is a member path outside the folder, and a folder that already holds files (a
    second import would overwrite the first's files and mix the two)."""
    results = Path(results)
    if results.exists() and any(results.iterdir()):
        raise FileExistsError(
            f"{results}: not empty; unpack the archive into a new folder (--results NEW) or remove this one first"
        )
    try:
        tar = tarfile.open(archive, "r:gz")
    except (tarfile.ReadError, EOFError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"{archive}: not an archive of gmc export-results (a gzip-compressed tar): {e}") from None
    with tar:
        names = tar.getnames()
        for name in names:
            if name.startswith("/") or ".." in Path(name).parts:
                raise ValueError(f"{archive}: unsafe member path {name!r}")
        missing = [
            what
            for what, found in (
                (PROVENANCE, PROVENANCE in names),
                ("train/ (the runs)", any(n.startswith("train/") for n in names)),
                ("tables/", any(n.startswith("tables/") for n in names)),
            )
            if not found
        ]
        if missing:
            raise ValueError(f"{archive}: not a bundle of gmc export-results: it has no {', no '.join(missing)}")
        tar.extractall(results, filter="data")
    return len(names)
