"""``gmc quickstart``: the pipeline once, small, in a few minutes on a CPU, each step saying what
it made and where it is. It checks the data root, redraws a published figure from its bundle
(``gmc report``'s code), builds a small tiny policy (``gmc build-tiny-model`` with a shorter
warm start), trains one estimator at a small fixed delay and evaluates the trained model beside
the base model (``gmc train --evaluate``, ``gmc evaluate``), all under one folder. The training
and evaluation configs are written there as files, so that each step can be run again by hand
with the command it prints.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from gmc.settings import ConfigError

QUICK_MODEL = {"max_steps": 150, "eval_every": 150, "eval_problems": 64}
"""The tiny policy's warm start, shortened (:class:`~gmc.run.tiny_model.TinyModelConfig`; the
sweep's takes 500 steps)."""

QUICK_RUN = {
    "device": "cpu",
    "algorithm": "gmc",
    "steps": 16,
    "group_size": 8,
    "prompts_per_step": 4,
    "lr": 3.0e-4,
    "behaviour_logprobs": "sampler",
    "checkpoint_every": 0,
    "delay": {"mode": "fixed", "d": 2},
    "sampling": {"max_new_tokens": 48},
}
"""The training run (:class:`~gmc.run.config.TrainConfig` keys, the model's folder added): GMC at
a fixed delay of 2 steps on the synthetic task."""

QUICK_EVAL = {
    "benchmarks": ["synthetic"],
    "synthetic_problems": 100,
    "samples": {"synthetic": 2},
    "max_new_tokens": 48,
    "device": "cpu",
}
"""The evaluation (:class:`~gmc.run.evaluate.EvalConfig` keys): 100 problems of the synthetic
task's test split (the tiny policy knows arithmetic only: on MATH500 it scores 0)."""

WINDOW = 4
"""Steps at each end of the run whose mean training reward the quick start prints."""

PUBLISHED_FIGURE = "score_vs_delay"
"""The figure redrawn from the published bundle."""


def say(step: str, text: str) -> None:
    print(f"[{step}] {text}", flush=True)


def check_out(out: Path) -> None:
    """Refuse a folder that already holds files: nothing of an earlier quick start is overwritten."""
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out}: holds files already; remove it or give another --out")


def check_data(root: str | None, out: Path) -> None:
    """Check the data root (``gmc prepare-data --source local``) and write its manifest under
    ``out/data``, or say what to do where it does not hold every registered set. The steps after
    it need none: the synthetic task is generated."""
    from gmc.io import write_json
    from gmc.tasks.datasets import DEFAULT_DATA_ROOT_ENV, DataError, data_root
    from gmc.tasks.prepare import prepare, registered

    where = data_root(root)
    try:
        manifest = prepare(registered(), root, "local")
    except DataError as e:
        say("data", f"no data at {where} ({e}).")
        say(
            "data",
            "The quick start runs on the synthetic task, which needs no files. For MATH and the six "
            f"benchmarks (the paper preset) set {DEFAULT_DATA_ROOT_ENV} to an offline copy, or run "
            "`gmc prepare-data --source hub` on a connected machine.",
        )
        return
    write_json(out / "data" / "manifest.json", manifest)
    sets = ", ".join(f"{name} {entry['rows']}" for name, entry in manifest["sets"].items())
    say("data", f"{where}: {sets} rows -> {out / 'data' / 'manifest.json'}")


def redraw_published(bundle: Path, out: Path) -> None:
    """Draw :data:`PUBLISHED_FIGURE` from the bundle's run directories into ``out/figures``."""
    from gmc.results.collect import collect
    from gmc.results.outputs import FIGURES

    if not (bundle / "train").is_dir():
        say(
            "figure",
            f"no published bundle at {bundle}: run from the repository's folder, or give --published BUNDLE; skipped",
        )
        return
    paths = FIGURES[PUBLISHED_FIGURE].resolve()(collect(bundle), out / "figures")
    say("figure", f"{FIGURES[PUBLISHED_FIGURE].label} of {bundle}, redrawn -> {', '.join(map(str, paths))}")
    say("figure", f"all of its tables and figures: gmc report --results {bundle} (seconds; its tables/main.md)")


def build_model(out: Path) -> Path:
    from gmc.run.tiny_model import TinyModelConfig, build_tiny_model

    model = out / "model"
    summary = build_tiny_model(model, TinyModelConfig(**QUICK_MODEL))
    say(
        "model",
        f"tiny Qwen3-architecture policy, {summary['parameters']:,} parameters, warm-started for "
        f"{summary['steps']} steps (greedy accuracy {summary['greedy_accuracy']:.3f}) in "
        f"{summary['seconds']:.0f} s -> {model}",
    )
    return model


def write_yaml(path: Path, values: dict) -> Path:
    import yaml

    from gmc.io import write_text

    write_text(path, yaml.safe_dump(values, sort_keys=False))
    return path


def train_and_evaluate(out: Path, model: Path) -> None:
    from gmc.run.evaluate import EvalConfig, evaluate
    from gmc.run.main import main_train
    from gmc.run.rundir import METRICS
    from gmc.run.summary import summarize_metrics
    from gmc.settings import load_config

    train_cfg = write_yaml(out / "train.yaml", {"model": str(model), **QUICK_RUN})
    eval_cfg = write_yaml(out / "eval.yaml", QUICK_EVAL)
    run, trained, base = out / "run", out / "eval" / "trained", out / "eval" / "base"
    say("train", f"gmc train --config {train_cfg} --out {run} --evaluate {eval_cfg} --eval-out {trained}")
    main_train(str(train_cfg), [], str(run), False, (str(eval_cfg), str(trained)))
    summary = summarize_metrics(run / METRICS, WINDOW)
    say(
        "train",
        f"{QUICK_RUN['algorithm']}, {summary['steps']} steps at delay {QUICK_RUN['delay']['d']} (mean staleness "
        f"{summary['async/staleness_mean']:.2f}): training reward {summary[f'rollout/reward_mean_first{WINDOW}']:.3f} "
        f"in the first {WINDOW} steps, {summary[f'rollout/reward_mean_last{WINDOW}']:.3f} in the last {WINDOW} -> {run}",
    )
    say("evaluate", f"gmc evaluate --model {model} --out {base} --config {eval_cfg}")
    evaluate(str(model), str(base), load_config(EvalConfig, str(eval_cfg)))
    for name in QUICK_EVAL["benchmarks"]:
        scores = {
            side: json.loads((folder / f"{name}.json").read_text())
            for side, folder in (("base", base), ("trained", trained))
        }
        say(
            "evaluate",
            f"{name}: greedy {scores['base']['greedy']:.3f} -> {scores['trained']['greedy']:.3f}, Pass@1 "
            f"{scores['base']['pass_at_1']:.3f} -> {scores['trained']['pass_at_1']:.3f} (base -> trained)",
        )
    say(
        "evaluate",
        f"{QUICK_RUN['steps']} steps and {QUICK_EVAL['synthetic_problems']} problems check that every step runs; "
        "they measure nothing (make run trains 128 steps a run over five seeds and gives each score its interval)",
    )


def quickstart(
    out: str | Path = "results/quickstart", published: str | Path = "published/default", data_root=None
) -> float:
    """Run the quick start into ``out``; returns its wall-clock seconds."""
    start = time.monotonic()
    out, bundle = Path(out), Path(published)
    check_out(out)
    check_data(data_root, out)
    redraw_published(bundle, out)
    train_and_evaluate(out, build_model(out))
    seconds = time.monotonic() - start
    say("done", f"in {seconds / 60:.1f} min. Where to look next:")
    for line in (
        f"{out}/run/metrics.jsonl: one line a step (reward, staleness, the estimator's diagnostics); summary.json",
        f"{out}/eval/: each benchmark's scores (<benchmark>.json) and completions, base and trained",
        f"{out}/train.yaml: change a key (algorithm: tic, delay.d: 8) and train again with the command above",
        "make run: the default sweep (grpo, tic, gmc x delays x five seeds, tables, figures; about half an hour)",
        "docs/getting-started.md, docs/python.md: the sweeps, GPUs, clusters, and gmc from Python",
    ):
        print(f"  {line}")
    return seconds
