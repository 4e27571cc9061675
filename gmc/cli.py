"""Command line: ``gmc <subcommand> ...`` (also ``python -m gmc``).

Progress and messages of the ``gmc`` loggers go to stderr at INFO (DEBUG with ``--debug``). An
error ends the command with one line on stderr, ``gmc <subcommand>: error: <message>``, and exit
status 1; ``--debug`` shows the traceback instead. Torch's CPU work uses one thread unless
``OMP_NUM_THREADS`` says otherwise (:data:`THREADS`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from gmc import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gmc", description="Asynchronous RL post-training with group-mass capping")
    parser.add_argument("--version", action="version", version=f"gmc {__version__}")
    parser.add_argument("--debug", action="store_true", help="debug logging; show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "quickstart",
        help="the pipeline in a few minutes on a CPU: a published figure redrawn, a small tiny model "
        "built, one estimator trained at a small delay and evaluated",
        description="Checks the data root, redraws a published figure, builds a small tiny model, trains "
        "GMC for 16 steps at a fixed delay of 2 and evaluates it beside the base model, all under --out, "
        "printing what each step made and the command that makes it by hand.",
    )
    p.add_argument("--out", default="results/quickstart", help="its folder (default: results/quickstart)")
    p.add_argument(
        "--published",
        default="published/default",
        help="the bundle whose figure it redraws (default: published/default)",
    )
    p.add_argument(
        "--data-root", default=None, help="local data root (default: $GMC_DATA_ROOT, else data/ in the repository)"
    )
    p.set_defaults(func=_quickstart)

    p = sub.add_parser("theory", help="exactly solvable checks of the paper's claims (CSV + figures)")
    p.add_argument("--out", required=True, help="output folder for CSVs and figures")
    p.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulations' randomness (default 0)")
    p.set_defaults(func=_theory)

    p = sub.add_parser(
        "gradient-lab",
        help="the estimators' bias, second moment and caps measured on a language "
        "model's gradients at pairs of weights from a history (CSV + figures)",
    )
    p.add_argument("--history", required=True, help="run directory of a finished history (gmc history)")
    p.add_argument("--out", required=True, help="output folder for CSVs, Markdown and figures")
    _settings_arguments(p, "GradientLabConfig (gmc/theory/config.py): delays, group sizes, batches", "batches=8")
    p.set_defaults(func=_gradient_lab)

    p = sub.add_parser("build-tiny-model", help="build and warm-start the tiny CPU policy")
    p.add_argument("--out", required=True, help="folder for the saved model and tokenizer")
    _settings_arguments(p, "TinyModelConfig (gmc/run/tiny_model.py): shape and warm start", "max_steps=200")
    p.set_defaults(func=_build_tiny_model)

    p = sub.add_parser(
        "build-random-model", help="build a random-init Qwen3-architecture model with Qwen3's vocabulary (no download)"
    )
    p.add_argument("--out", required=True, help="folder for the saved model and tokenizer")
    _settings_arguments(p, "RandomModelConfig (gmc/run/random_model.py): shape and tokenizer", "num_layers=4")
    p.add_argument("--source", default="local", choices=["local", "hub"], help="where the MATH problems come from")
    p.add_argument(
        "--data-root", default=None, help="local data root (default: $GMC_DATA_ROOT, else data/ in the repository)"
    )
    p.set_defaults(func=_build_random_model)

    p = sub.add_parser("grade-oracle", help="grade each benchmark's reference solutions against its gold answers")
    p.add_argument(
        "--data", default=None, help="local data root (default: $GMC_DATA_ROOT, else data/ in the repository)"
    )
    p.add_argument("--benchmarks", nargs="*", default=None, help="default: every benchmark with reference solutions")
    p.add_argument("--out", default=None, help="optional JSON file for the agreement table")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds one grading may take (default 5)")
    p.set_defaults(func=_grade_oracle)

    p = sub.add_parser(
        "train",
        help="train one run (asynchronous RL with the chosen estimator)",
        description="Train one run into a run directory. Ctrl-C, SIGTERM or SIGUSR1 stop it at the "
        "next step boundary with a checkpoint (exit status 75; continue with gmc train "
        "--resume --out DIR); a second Ctrl-C aborts at once (exit status 130).",
    )
    _settings_arguments(p, "TrainConfig (gmc/run/config.py)", "estimator.eps=0.1")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the run directory's checkpoint (without --config: the run the folder holds, "
        "from its config.yaml; without a checkpoint the run starts from step 0, and says so)",
    )
    p.add_argument(
        "--evaluate",
        default=None,
        metavar="EVAL_CONFIG",
        help="then evaluate the trained model in this process with this EvalConfig file (as gmc evaluate "
        "does: the same scores, without a second start-up); needs --eval-out",
    )
    p.add_argument("--eval-out", default=None, help="with --evaluate: the folder for <benchmark>.json and completions")
    p.add_argument(
        "--prefill",
        default=None,
        metavar="FILE",
        help="start a fixed-delay run from this prefill (gmc prefill) instead of generating its d "
        "batches; it must be made for the same settings but the estimator (ignored on --resume)",
    )
    p.add_argument(
        "--history",
        default=None,
        metavar="DIR",
        help="with delay.warmup history: start from this history (gmc history) instead of training its "
        "own first; it must be made for the same settings but the estimator and the delay "
        "(ignored on --resume)",
    )
    p.set_defaults(func=_train)

    p = sub.add_parser(
        "history",
        help="train the on-policy history that a run with delay.warmup history starts "
        "from, which every run of the same settings but the estimator and the delay can share "
        "(gmc train --history); an interrupted one goes on from its checkpoint",
    )
    _settings_arguments(
        p, "TrainConfig (gmc/run/config.py) of a run that starts from the history", "delay.history_steps=64"
    )
    p.add_argument("--out", required=True, help="the history's run directory")
    p.add_argument(
        "--queues",
        type=int,
        nargs="*",
        default=None,
        metavar="D",
        help="generate the queue of each of these fixed delays for the runs that start from it: d batches of "
        "the prompts that come after its own, each made by the version d steps before the run's step that "
        "trains it (default: the run's delay.d; none: no queue)",
    )
    p.set_defaults(func=_history)

    p = sub.add_parser(
        "prefill",
        help="write a fixed-delay run's prefill (the d batches of its starting weights), "
        "which every run of the same settings but the estimator can start from (gmc train --prefill)",
    )
    _settings_arguments(p, "TrainConfig (gmc/run/config.py)", "delay.d=32")
    p.add_argument("--out", required=True, help="the prefill file (written atomically)")
    p.set_defaults(func=_prefill)

    p = sub.add_parser(
        "plan-memory",
        help="the predicted peak memory of a training run, item by item, per phase",
        description="The memory plan of gmc.policy.memory for a train config (--config/--set) or for the "
        "train section and model of a workflow preset (--preset); exit status 1 when "
        "it does not fit the given or detected GPU.",
    )
    _settings_arguments(p, "TrainConfig (gmc/run/config.py)", "sampling.max_new_tokens=4096")
    p.add_argument("--preset", default=None, help="a workflow config (config.yaml or workflow/presets/*.yaml)")
    p.add_argument(
        "--point",
        default=None,
        metavar="algo~A/delay~D/group~G/seed~S",
        help="with --preset: the sweep point to plan (default: its largest group and delay)",
    )
    p.add_argument(
        "--gpu-gib",
        type=float,
        default=None,
        help="device memory in GiB (an 80 GB card has about 79.6); default: memory_limit_gib, else the CUDA device's",
    )
    p.set_defaults(func=_plan_memory)

    p = sub.add_parser("evaluate", help="greedy accuracy and Pass@1 of one checkpoint on benchmarks")
    p.add_argument("--model", required=True, help="checkpoint folder (a run's model/) or hub name")
    p.add_argument("--out", required=True, help="folder for <benchmark>.json and completions")
    _settings_arguments(p, "EvalConfig (gmc/run/evaluate.py)", "samples.synthetic=8")
    p.add_argument("--benchmarks", nargs="+", default=None, help="shorthand for --set benchmarks=[...]")
    p.set_defaults(func=_evaluate)

    p = sub.add_parser("mlflow-sync", help="import run directories into MLflow, or bring earlier imports up to date")
    p.add_argument("run_dirs", nargs="*", help="run directories (results/train/...)")
    p.add_argument(
        "--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, else sqlite:///results/mlflow.db"
    )
    p.add_argument("--experiment", default=None, help="default: $MLFLOW_EXPERIMENT_NAME, else gmc")
    p.add_argument(
        "--sweep",
        default=None,
        metavar="RESULTS",
        help="the sweep's results folder: make sure its parent run exists; with run directories, "
        "also log the base model's scores to it and mark it finished",
    )
    p.add_argument("--out", default=None, help="optional JSON file mapping run directories to MLflow run ids")
    p.set_defaults(func=_mlflow_sync)

    p = sub.add_parser(
        "prepare-data",
        help="download (--source hub) or check the data sets; write a manifest",
        description="Without --train and --benchmarks: the MATH training split and the six "
        "benchmarks. --source hub downloads them into the data root (a connected "
        "machine); --source local checks the files already there (offline).",
    )
    p.add_argument("--train", default=None, help="training set: math, synthetic or a JSONL/JSON/Parquet file")
    p.add_argument("--benchmarks", nargs="*", default=None, help="benchmark names (synthetic: generated)")
    p.add_argument(
        "--source",
        default="local",
        choices=["local", "hub"],
        help="local: check the files under the data root; hub: download them there first",
    )
    p.add_argument("--data-root", default=None, help="default: $GMC_DATA_ROOT, else data/ in the repository")
    p.add_argument("--out", default=None, help="manifest file (default: <data root>/manifest.json)")
    p.add_argument(
        "--check",
        default=None,
        metavar="MANIFEST",
        help="fail unless every file has the rows and sha256 of this earlier manifest",
    )
    p.set_defaults(func=_prepare_data)

    p = sub.add_parser("fetch-model", help="download a model from the Hugging Face hub into a folder")
    p.add_argument("--name", required=True, help="the model's name on the hub (e.g. Qwen/Qwen3-0.6B)")
    p.add_argument("--out", required=True, help="folder for the model and its tokenizer")
    p.set_defaults(func=_fetch_model)

    for name, helptext in (
        ("tables", "tables (CSV, Markdown, LaTeX) from the run directories"),
        ("figures", "figures (PNG, PDF) from the run directories"),
        ("report", "tables and figures from cached results: no training, no evaluation"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument(
            "--results", default="results", help="a sweep's results folder or a published bundle (default: results)"
        )
        p.set_defaults(func=_report, what=name)

    p = sub.add_parser(
        "league-figure",
        help="final score against delay per estimator, one panel per regime (results folder), from cached results",
    )
    p.add_argument(
        "--regime",
        action="append",
        required=True,
        metavar="NAME=RESULTS",
        help="a panel: its title and results folder (repeat, e.g. short=results/corrections)",
    )
    p.add_argument(
        "--out", default="results/league", help="folder for league.png and league.pdf (default: results/league)"
    )
    p.set_defaults(func=_league_figure)

    p = sub.add_parser("export-results", help="the bundle of gmc publish (no checkpoints) packed into one .tar.gz")
    p.add_argument("--results", default="results", help="the sweep's results folder (default: results)")
    p.add_argument("--out", required=True, help="the archive to write (.tar.gz)")
    p.add_argument(
        "--log",
        action="append",
        default=[],
        metavar="SNAKEMAKE_LOG",
        help="as for gmc publish: the sweep's time per stage (default: what the results folder records, if any)",
    )
    p.set_defaults(func=_export)

    p = sub.add_parser(
        "publish",
        help="the bundle of a finished sweep: what redraws its tables and figures, "
        "no checkpoints (then draw its figures with gmc report --results BUNDLE)",
    )
    p.add_argument("--results", default="results", help="the finished sweep's results folder (default: results)")
    p.add_argument("--out", required=True, help="the bundle's folder, replaced whole (e.g. published/default)")
    p.add_argument(
        "--log",
        action="append",
        default=[],
        metavar="SNAKEMAKE_LOG",
        help="Snakemake's log of the sweep's run (.snakemake/log/...; repeat for a run continued): its "
        "time per stage goes into provenance.json",
    )
    p.set_defaults(func=_publish)

    p = sub.add_parser(
        "quote-bundles",
        help="rewrite the blocks a document includes from a bundle "
        "(<!-- include PATH -->) and check that every number of its prose marked <!-- numbers from "
        "BUNDLE --> is printed in that bundle and every verdict word there is the one its tables/conclusions.md "
        "gives, in the family its sentence names (exit 1, naming each line, where one is not)",
    )
    p.add_argument("docs", nargs="*", help="the documents (default: README.md and every page under docs/)")
    p.add_argument(
        "--check", action="store_true", help="change nothing: an included block that differs from its file fails too"
    )
    p.set_defaults(func=_quote_bundles)

    p = sub.add_parser(
        "compare-results",
        help="a re-run's tables against a published bundle: every estimate, "
        "and each published conclusion held (resolved or equivalent again), weakened (no longer resolved or "
        "equivalent, not contradicted) or failed (contradicted or missing), with the count of each "
        "(exit 0: none failed, 1: one failed, 2: unreadable)",
    )
    p.add_argument("bundle", help="the published bundle (e.g. published/default)")
    p.add_argument("results", help="the re-run's results folder (e.g. results)")
    p.set_defaults(func=_compare_results)

    p = sub.add_parser(
        "plan-seeds",
        help="the seeds a confirmatory sweep's hypotheses (its preset's analysis.hypotheses) need for 80%% power "
        "at a difference after Holm's adjustment, from each contrast's spread over an earlier bundle's seeds",
    )
    p.add_argument("preset", help="the confirmatory sweep's configuration (e.g. workflow/presets/confirm.yaml)")
    p.add_argument("bundle", help="the bundle whose runs give the spread (e.g. published/corrections)")
    p.add_argument("--difference", type=float, default=0.05, help="the difference to detect (default: 0.05)")
    p.set_defaults(func=_plan_seeds)

    p = sub.add_parser("import-results", help="unpack an archive made by export-results")
    p.add_argument("bundle", help="the archive (.tar.gz) of gmc export-results")
    p.add_argument("--results", default="results", help="the folder to unpack it into (default: results)")
    p.set_defaults(func=_import)
    for p in sub.choices.values():  # --debug also after the subcommand
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        p.set_defaults(subparser=p)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser``'s arguments, where an argument the subcommand does not take is refused with the
    subcommand's usage (``gmc train --steps 3``: ``gmc train``'s), not the list of every command."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        hint = ""
        if "overrides" in args and extra[0].startswith("--"):  # a setting given as an option
            key, sep, value = extra[0][2:].partition("=")
            if not sep:
                value = extra[1] if len(extra) > 1 and not extra[1].startswith("-") else "VALUE"
            hint = f" (a setting goes in --set KEY=VALUE: --set {key.replace('-', '_')}={value})"
        args.subparser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    return args


def _settings_arguments(p: argparse.ArgumentParser, what: str, example: str) -> None:
    """``--config FILE`` and repeatable ``--set KEY=VALUE`` for the settings class ``what``, with
    ``example``, one of its keys, in the help."""
    p.add_argument("--config", default=None, help=f"YAML file of {what} keys (default: built-in defaults)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config key, dotted for nested keys ({example}); repeatable",
    )


MASTERS = {True: " over float32 masters", "optimizer": " live, float32 masters in the optimizer", False: " in place"}
"""How ``gmc plan-memory`` names a run's ``master_weights`` below float32."""


def _quickstart(args: argparse.Namespace) -> None:
    from gmc.quickstart import quickstart

    quickstart(args.out, args.published, args.data_root)


def _plan_memory(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gmc.policy.memory import GIB, ModelShape, checkpoint_host_bytes, device_limit, plan
    from gmc.run.config import TrainConfig
    from gmc.settings import apply_overrides, from_dict, load_config

    if args.preset:  # the run of the preset's sweep that needs the most memory, resolved as its job is
        from gmc.settings import to_dict
        from gmc.sweep.points import Point
        from gmc.workflow import load_file

        sweep = load_file(args.preset)
        point = Point.parse(args.point) if args.point else sweep.largest_point()
        print(f"{args.preset}: run {point.path}")
        values = to_dict(sweep.run(point))
        if not Path(values["model"]).exists():  # not fetched yet: the hub id's known shape
            values["model"] = sweep.config.model
        cfg = from_dict(TrainConfig, apply_overrides(values, args.overrides))
    else:
        cfg = load_config(TrainConfig, args.config, args.overrides)
    shape = ModelShape.of(cfg.model)
    p = plan(cfg, device_limit(cfg, args.gpu_gib), shape)
    print(
        f"memory plan of {cfg.model}: budget {cfg.micro_batch_tokens} tokens, {cfg.model_dtype}"
        f"{MASTERS[cfg.master_weights] if cfg.model_dtype != 'float32' else ''}, "
        f"{cfg.optimizer}, engine {cfg.engine}"
        + (f" (share {cfg.vllm.gpu_memory_utilization}, sleep {cfg.vllm.sleep})" if cfg.engine == "vllm" else "")
    )
    print(p.table())
    layers = shape.num_hidden_layers
    print(
        f"gradient checkpointing: {p.checkpointed_layers} of {layers} layers"
        f"{' (auto)' if cfg.gradient_checkpointing == 'auto' else ''}, a step's training forward and backward "
        f"{3 + p.checkpointed_layers / layers:.2f} forwards' work a token; a resume reads the checkpoint into "
        f"{checkpoint_host_bytes(cfg) / GIB:.1f} GiB of host memory (its queued rollouts stay there)"
    )
    if not p.fits:
        print(f"largest items: {p.advice()}")
    return 0 if p.fits else 1


def _prepare_data(args: argparse.Namespace) -> None:
    """Download or check every set named (default: all registered) and write the manifest."""
    from pathlib import Path

    from gmc.io import write_json
    from gmc.tasks.datasets import data_root
    from gmc.tasks.prepare import MANIFEST, check_manifest, prepare, registered

    names = ([args.train] if args.train else []) + list(args.benchmarks or [])
    expected = json.loads(Path(args.check).read_text()) if args.check else None  # a bad --check fails first
    manifest = prepare(names or registered(), args.data_root, args.source)
    if expected is not None:
        check_manifest(expected, args.data_root)
    write_json(args.out or data_root(args.data_root) / MANIFEST, manifest)
    print(json.dumps(manifest, indent=2))


def _fetch_model(args: argparse.Namespace) -> None:
    from huggingface_hub import snapshot_download

    from gmc.io import atomic_dir

    with atomic_dir(args.out) as tmp:
        snapshot_download(args.name, local_dir=tmp)
    print(f"{args.name} -> {args.out}")


def _league_figure(args: argparse.Namespace) -> None:
    from gmc.results.figures import league_figure

    regimes = {}
    for item in args.regime:
        name, sep, results = item.partition("=")
        if not sep or not name or not results:
            raise ValueError(f"--regime {item!r}: expected NAME=RESULTS (e.g. short=results/corrections)")
        regimes[name] = results
    paths = league_figure(regimes, args.out)
    print(f"league figure: {', '.join(str(p) for p in paths)}")


def _report(args: argparse.Namespace) -> None:
    from gmc.results.bundles import write_stages
    from gmc.results.figures import run_figures
    from gmc.results.outputs import LAB_FOLDER
    from gmc.results.tables import write_tables

    if args.what in ("tables", "report"):
        tables = write_tables(args.results)
        write_stages(args.results)  # a bundle's time per stage, where its provenance records it
        print(f"tables: {', '.join(tables)} -> {args.results}/tables")
    if args.what in ("figures", "report"):
        paths = run_figures(args.results)
        print(f"figures: {len(paths)} files -> {args.results}/figures")
        lab = Path(args.results) / LAB_FOLDER
        if (lab / "gradients.csv").exists():  # the gradient lab's, where the sweep ran it
            from gmc.theory.figures import lab_report

            print(f"gradient lab: {len(lab_report(lab))} files -> {lab}")


def _export(args: argparse.Namespace) -> None:
    from gmc.results.bundles import export_results

    print(f"{export_results(args.results, args.out, args.log)} files -> {args.out}")


def _publish(args: argparse.Namespace) -> None:
    from gmc.results.bundles import publish

    print(f"{publish(args.results, args.out, args.log)} files -> {args.out}")


def _quote_bundles(args: argparse.Namespace) -> None:
    from gmc.results.quotes import documents, misjudged, refresh, stale_includes, unquoted

    problems = []
    for doc in args.docs or documents():
        if args.check:
            problems += stale_includes(doc)
        else:
            print(f"{doc}: {refresh(doc)} included blocks rewritten")
        problems += unquoted(doc) + misjudged(doc)
    for problem in problems:
        print(problem, file=sys.stderr)
    raise SystemExit(1 if problems else 0)


def _compare_results(args: argparse.Namespace) -> None:
    from gmc.results.compare import Unreadable, compare, report

    try:
        comparison = compare(args.bundle, args.results)
    except Unreadable as err:
        print(f"gmc compare-results: error: {error_line(err)}", file=sys.stderr)
        raise SystemExit(2) from None
    print(report(comparison))
    raise SystemExit(1 if comparison.failed else 0)


def _plan_seeds(args: argparse.Namespace) -> None:
    from gmc.results.collect import collect
    from gmc.results.inference import seed_plan
    from gmc.results.outputs import AnalysisConfig
    from gmc.settings import ConfigError, from_section, read_config_file

    analysis = from_section(AnalysisConfig, read_config_file(args.preset).get("analysis") or {}, "analysis")
    if not analysis.hypotheses:
        raise ConfigError("the preset states no hypotheses to plan for", "analysis.hypotheses")
    plan = seed_plan(collect(args.bundle), analysis.hypotheses, args.difference, analysis.equivalence_margin)
    print(f"Spread of each hypothesis's contrast over the seeds of {args.bundle}, and the seeds at which a family")
    print(f"of {len(plan)} tests detects {args.difference} at 80% power after Holm's adjustment:\n")
    print("| hypothesis | contrast | seeds there | contrast there | sd | seeds needed |")
    print("|---|---|---|---|---|---|")
    for r in plan.itertuples():
        print(f"| {r.name} | {r.contrast} | {r.n_seeds} | {r.diff:+.3f} | {r.sd:.4f} | {r.seeds} |")
    print(f"\nseeds needed for every hypothesis: {int(plan['seeds'].max())}")


def _theory(args: argparse.Namespace) -> None:
    from gmc.theory.lab import run_from_args  # scipy and pandas: only this command needs them

    run_from_args(args)


def _gradient_lab(args: argparse.Namespace) -> None:
    from gmc.theory.gradients import run_from_args

    run_from_args(args)


def _import(args: argparse.Namespace) -> None:
    from gmc.results.bundles import import_results

    print(f"{import_results(args.bundle, args.results)} files -> {args.results}")


def _train(args: argparse.Namespace) -> int:
    from gmc.stop import STOP

    if (args.evaluate is None) != (args.eval_out is None):
        raise ValueError("--evaluate, --eval-out: they go together (the evaluation's config and its folder)")
    STOP.install()  # before the heavy imports: a stop signal during start-up is kept, not fatal
    from gmc.run.main import main_train
    from gmc.run.trainer import PREEMPTED, Preempted

    evaluation = (args.evaluate, args.eval_out) if args.evaluate else None
    try:
        summary = main_train(args.config, args.overrides, args.out, args.resume, evaluation, args.prefill, args.history)
    except Preempted as e:
        print(f"gmc train: {e}", file=sys.stderr)
        return PREEMPTED
    print(json.dumps(summary, indent=2))
    return 0


def _history(args: argparse.Namespace) -> int:
    from gmc.stop import STOP

    STOP.install()
    from gmc.run.main import main_history
    from gmc.run.trainer import PREEMPTED, Preempted

    try:
        main_history(args.config, args.overrides, args.out, args.queues)
    except Preempted as e:
        print(f"gmc history: {e}", file=sys.stderr)
        return PREEMPTED
    return 0


def _prefill(args: argparse.Namespace) -> None:
    from gmc.run.main import main_prefill

    main_prefill(args.config, args.overrides, args.out)


def _evaluate(args: argparse.Namespace) -> None:
    from gmc.run.evaluate import EvalConfig, evaluate
    from gmc.settings import load_config

    overrides = list(args.overrides)
    if args.benchmarks:
        overrides.append(f"benchmarks=[{','.join(args.benchmarks)}]")
    cfg = load_config(EvalConfig, args.config, overrides)
    for name, s in evaluate(args.model, args.out, cfg).items():
        cells = [f"{key} {s[key]:.4f}" for key in ("greedy", "pass_at_1") if key in s]
        print(f"{name:15s} " + "  ".join(cells))


def _mlflow_sync(args: argparse.Namespace) -> None:
    from gmc.io import write_json
    from gmc.run.tracking import resolve_experiment, resolve_uri, sync_run, sync_sweep

    if not args.run_dirs and not args.sweep:
        raise ValueError("give run directories, --sweep RESULTS, or both")
    uri, experiment = resolve_uri(args.tracking_uri), resolve_experiment(args.experiment)
    out: dict = {"tracking_uri": uri, "experiment": experiment}
    if args.sweep:
        out["sweep"] = sync_sweep(args.sweep, uri, experiment, finish=bool(args.run_dirs))
    synced = {run_dir: sync_run(run_dir, uri, experiment) for run_dir in args.run_dirs}  # each logs its line
    if args.out:
        write_json(args.out, {**out, "runs": synced})


def _build_tiny_model(args: argparse.Namespace) -> None:
    from gmc.run.tiny_model import TinyModelConfig, build_tiny_model
    from gmc.settings import load_config

    summary = build_tiny_model(args.out, load_config(TinyModelConfig, args.config, args.overrides))
    print(
        f"tiny model: {summary['parameters']:,} parameters, greedy accuracy {summary['greedy_accuracy']:.3f} "
        f"after {summary['steps']} steps in {summary['seconds']:.0f} s -> {args.out}"
    )


def _build_random_model(args: argparse.Namespace) -> None:
    from gmc.run.random_model import RandomModelConfig, build_random_qwen3
    from gmc.settings import load_config

    cfg = load_config(RandomModelConfig, args.config, args.overrides)
    summary = build_random_qwen3(args.out, cfg, data_root=args.data_root, data_source=args.source)
    print(
        f"random Qwen3-architecture model: {summary['parameters']:,} parameters, {summary['vocab_rows']:,} "
        f"vocabulary rows, {summary['tokenizer_entries']:,} tokenizer entries -> {args.out}"
    )


def _grade_oracle(args: argparse.Namespace) -> None:
    from gmc.io import write_json
    from gmc.tasks.grading import grade_oracle

    table = grade_oracle(args.benchmarks, root=args.data, timeout=args.timeout)
    for name, row in table.items():
        print(f"{name:15s} {row['agreement']:.4f}  ({row['correct']}/{row['n']}; reasons {row['reasons']})")
    if args.out:
        write_json(args.out, table)


def _configure_logging(debug: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    gmc_log = logging.getLogger("gmc")
    gmc_log.handlers[:] = [handler]
    gmc_log.setLevel(logging.DEBUG if debug else logging.INFO)


def error_line(e: BaseException) -> str:
    """An exception as one line: its message (whitespace collapsed), and the exception's type
    where the message alone would not say what went wrong; an operating system's error as the
    file it concerns and what is wrong with it (``runs/x: file exists``), without its errno."""
    if isinstance(e, OSError) and e.strerror and e.filename is not None:
        what = e.strerror[0].lower() + e.strerror[1:]
        return f"{e.filename}: {what}" + (f" ({e.filename2})" if e.filename2 else "")
    message = " ".join(str(e).split())
    if not message or isinstance(e, (KeyError, AttributeError, TypeError, IndexError, AssertionError)):
        message = f"{type(e).__name__}: {message}" if message else type(e).__name__
    return message


THREADS = "1"
"""The threads of torch's and the BLAS libraries' CPU work in a command run with ``OMP_NUM_THREADS``
unset: one, the fastest for the tiny model on a 2-core machine (a 60-step warm start: 23 s at one
thread, 62 s at two). ``OMP_NUM_THREADS=N gmc ...`` sets another count; the workflow's jobs set it
to their ``threads``."""


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", THREADS)  # before torch is imported, which reads it once
    args = parse(build_parser(), argv)
    _configure_logging(args.debug)
    try:
        status = args.func(args)
    except KeyboardInterrupt:
        print(f"gmc {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.debug:
            raise
        print(f"gmc {args.command}: error: {error_line(e)} (--debug for the traceback)", file=sys.stderr)
        return 1
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
