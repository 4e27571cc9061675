"""What users of the command line and the repository meet: the version, one-line errors,
logging, file modes, the Python floor, the licence, the documented commands, progress bars."""

import json
import logging
import os
import re
import shlex
import subprocess
import sys
import tomllib

import pytest
from helpers import DOCS, REPO

import gmc
from gmc.cli import error_line, main
from gmc.io import atomic_dir, write_json, write_text


@pytest.fixture(autouse=True)
def restore_gmc_logger():
    """main() configures the gmc logger; later tests get it back as it was."""
    logger = logging.getLogger("gmc")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:], logger.level = handlers, level


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"gmc {version}" == f"gmc {gmc.__version__}"


def test_errors_are_one_line_naming_the_file_or_key(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert main(["train", "--config", str(missing), "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gmc train: error: ") and str(missing) in err
    assert "Traceback" not in err and "--debug" in err

    assert main(["train", "--set", "estimator.epz=0.1", "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "estimator.epz" in err

    with pytest.raises(Exception, match="estimator.epz"):  # --debug: the exception itself
        main(["--debug", "train", "--set", "estimator.epz=0.1", "--out", str(tmp_path / "run")])
    with pytest.raises(Exception, match="estimator.epz"):  # also after the subcommand
        main(["train", "--set", "estimator.epz=0.1", "--out", str(tmp_path / "run"), "--debug"])


def test_error_line():
    assert error_line(ValueError("bad\n  value")) == "bad value"
    assert error_line(KeyError("steps")) == "KeyError: 'steps'"
    assert error_line(RuntimeError()) == "RuntimeError"


def test_logging_is_configured(tmp_path, make_run_dir):
    """The gmc loggers print at INFO on stderr (the resume message, the MLflow import...)."""
    run_dir = make_run_dir(tmp_path / "results")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    done = subprocess.run(
        [sys.executable, "-m", "gmc", "mlflow-sync", str(run_dir), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"INFO gmc\.run\.tracking: .*seed~0 -> MLflow run \w+ \(3 new steps\)", done.stderr)
    assert len(re.findall("MLflow run", done.stdout + done.stderr)) == 1  # once, not echoed by a second handler


def test_an_option_a_subcommand_lacks_gets_its_usage_and_the_set_it_means(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["train", "--steps", "3", "--out", "r"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("usage: gmc train ") and "{theory," not in err
    assert err.strip().splitlines()[-1] == (
        "gmc train: error: unrecognized arguments: --steps 3 (a setting goes in --set KEY=VALUE: --set steps=3)"
    )
    with pytest.raises(SystemExit):
        main(["train", "--out", "r", "--group-size=4"])
    assert capsys.readouterr().err.strip().endswith("(a setting goes in --set KEY=VALUE: --set group_size=4)")


def test_an_unknown_key_far_from_every_key_lists_them():
    from gmc.run.config import TrainConfig
    from gmc.settings import ConfigError, from_dict

    with pytest.raises(ConfigError, match=r"^zzz: unknown key; none of the \d+ keys of the config is close to it: \["):
        from_dict(TrainConfig, {"zzz": 1})
    with pytest.raises(ConfigError, match=r"^sampling.max_new_token: unknown key; did you mean 'max_new_tokens'\?$"):
        from_dict(TrainConfig, {"sampling": {"max_new_token": 1}})


@pytest.mark.parametrize(
    "umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)]
)
def test_outputs_are_readable_as_the_umask_allows(tmp_path, umask, file_mode, dir_mode):
    old = os.umask(umask)
    try:
        write_text(tmp_path / "a.txt", "x")
        write_json(tmp_path / "sub" / "b.json", {})
        with atomic_dir(tmp_path / "model") as d:
            (d / "weights").write_text("w")
    finally:
        os.umask(old)
    for f in (tmp_path / "a.txt", tmp_path / "sub" / "b.json", tmp_path / "model" / "weights"):
        assert f.stat().st_mode & 0o777 == file_mode, f
    for d in (tmp_path / "sub", tmp_path / "model"):
        assert d.stat().st_mode & 0o777 == dir_mode, d


def test_python_floor_and_licence():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=3.11"
    assert project["tool"]["ruff"]["target-version"] == "py311"
    assert project["project"]["license"] == "MIT"
    licence = (REPO / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "the gmc authors" in licence


def documented_snakemake_commands() -> list[tuple[str, str]]:
    """Every ``snakemake ... --configfile ...`` command line in the README, the Makefile, the
    presets and the profiles."""
    files = [*DOCS, REPO / "Makefile", *REPO.glob("workflow/presets/*.yaml"), *REPO.glob("profiles/*/config.yaml")]
    found = []
    for f in files:
        for line in f.read_text().splitlines():
            m = re.search(r"snakemake\b([^`#]*--configfile[^`#]*)", line)
            if m:
                found.append((f.name, m.group(1).strip()))
    return found


def test_documented_configfile_usage_keeps_a_following_target():
    from snakemake.cli import get_argument_parser

    commands = documented_snakemake_commands()
    assert len(commands) >= 2
    parser = get_argument_parser()
    for source, args in commands:
        parsed = parser.parse_args([*shlex.split(args), "train_all"])
        assert parsed.targets == ["train_all"], f"{source}: {args}"


def test_vllm_hint_names_a_real_key():
    from gmc.run.config import TrainConfig
    from gmc.run.evaluate import EvalConfig

    text = (REPO / "gmc" / "rollouts" / "vllm_engine.py").read_text()
    hint = re.search(r"\(or set (\w+): hf in the train or evaluate config\)", text)
    assert hint and "rollout.engine" not in text
    assert hint.group(1) in TrainConfig.__dataclass_fields__ and hint.group(1) in EvalConfig.__dataclass_fields__


def test_evaluation_progress_counts_completions(tmp_path, tiny_model_dir, capsys, monkeypatch):
    import gmc.run.evaluate as ev

    monkeypatch.setattr(ev, "SAMPLES_PER_CALL", 4)  # several engine calls per benchmark
    cfg = ev.EvalConfig(benchmarks=("synthetic",), samples={"synthetic": 2}, limit=5, device="cpu", max_new_tokens=8)
    ev.evaluate(str(tiny_model_dir), tmp_path, cfg, progress=True)
    err = capsys.readouterr().err
    assert "evaluate synthetic (5 problems)" in err and "15/15" in err and "completion" in err
    rows = [json.loads(x) for x in (tmp_path / "synthetic.completions.jsonl").read_text().splitlines()]
    assert sorted((r["mode"], r["sample"]) for r in rows) == sorted(
        [("greedy", 0)] * 5 + [("sample", 0), ("sample", 1)] * 5
    )
    assert [r["id"] for r in rows if r["mode"] == "greedy"] == [r["id"] for r in rows if r["sample"] == 1]


def _bad_inputs(tmp_path):
    """Each command with a bad input: the command line and what its error line must name."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    folder = tmp_path / "folder"
    folder.mkdir()
    notgz = tmp_path / "notgz.tar.gz"
    notgz.write_text("not a gzip file")
    import tarfile

    stray = tmp_path / "stray.tar.gz"
    (tmp_path / "a.yaml").write_text("a: 1\n")
    with tarfile.open(stray, "w:gz") as tar:
        tar.add(tmp_path / "a.yaml", arcname="a.yaml")
    missing = tmp_path / "missing"
    picture = tmp_path / "pic.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    full = tmp_path / "full"
    full.mkdir()
    (full / "provenance.json").write_text("{}")
    return [
        (["train", "--config", str(picture), "--out", str(tmp_path / "r5")], f"{picture}: not a YAML config file"),
        (["train", "--set", "stpes=3", "--out", str(tmp_path / "r6")], "stpes: unknown key; did you mean 'steps'?"),
        (["import-results", str(missing), "--results", str(full)], f"{full}: not empty; unpack the archive into a new"),
        (["quickstart", "--out", str(tmp_path)], f"{tmp_path}: holds files already"),
        (["train", "--out", str(a_file)], f"{a_file}: a file, not a run directory"),
        (["train", "--config", str(folder), "--out", str(tmp_path / "r1")], f"{folder}: a folder, not a config file"),
        (["train", "--config", str(missing), "--out", str(tmp_path / "r2")], f"{missing}: config file not found"),
        (["train", "--set", "steps=ten", "--out", str(tmp_path / "r3")], "steps"),
        (["train", "--resume", "--out", str(missing)], f"--out {missing}: holds no run to resume"),
        (["train", "--evaluate", "e.yaml", "--out", str(tmp_path / "r4")], "--evaluate, --eval-out: they go together"),
        (["history", "--out", str(tmp_path / "h")], "delay.warmup: no history to make"),
        (["prefill", "--out", str(tmp_path / "p.pt")], "no prefill to write"),
        (["evaluate", "--model", str(missing), "--out", str(tmp_path / "e")], str(missing)),
        (["build-tiny-model", "--out", str(tmp_path / "m"), "--set", "lr=-1"], "lr"),
        (["build-random-model", "--out", str(tmp_path / "m2"), "--set", "hidden=x"], "hidden"),
        (["plan-memory", "--preset", str(missing)], str(missing)),
        (["mlflow-sync", str(missing), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"], str(missing)),
        (["prepare-data", "--check", str(missing)], str(missing)),
        (["tables", "--results", str(missing)], str(missing)),
        (["figures", "--results", str(missing)], str(missing)),
        (["report", "--results", str(missing)], str(missing)),
        (["league-figure", "--regime", "foo", "--out", str(tmp_path / "l")], "--regime 'foo': expected NAME=RESULTS"),
        (["export-results", "--results", str(missing), "--out", str(tmp_path / "x.tar.gz")], str(missing)),
        (["publish", "--results", str(missing), "--out", str(tmp_path / "b")], str(missing)),
        (["quote-bundles", str(missing)], str(missing)),
        (["compare-results", str(missing), str(missing)], str(missing)),
        (["import-results", str(missing), "--results", str(tmp_path / "i")], f"{missing}: no such file or directory"),
        (
            ["import-results", str(notgz), "--results", str(tmp_path / "i")],
            f"{notgz}: not an archive of gmc export-results",
        ),
        (
            ["import-results", str(stray), "--results", str(tmp_path / "i")],
            f"{stray}: not a bundle of gmc export-results: it has no provenance.json, no train/ (the runs), no tables/",
        ),
    ]


def test_every_command_reports_bad_input_in_one_format(tmp_path, capsys, monkeypatch):
    """``gmc <command>: error: <file, key or argument>: <what>``: one line, exit 1 (compare-results:
    2, a file it cannot read), no errno and no traceback; a failed start leaves no run folder. Run
    where nothing was built (a fresh clone): a refusal must not depend on a model being there."""
    monkeypatch.chdir(tmp_path)
    for argv, named in _bad_inputs(tmp_path):
        try:
            status = main(argv)
        except SystemExit as stop:  # commands with documented exit statuses (compare-results, quote-bundles)
            status = stop.code
        err = capsys.readouterr().err.strip().splitlines()
        assert status == (2 if argv[0] == "compare-results" else 1), (argv, err)
        line = err[-1]
        assert line.startswith(f"gmc {argv[0]}: error: ") and named in line, (argv, err)
        assert "[Errno" not in line and not any("Traceback" in e for e in err), (argv, err)
    assert not (tmp_path / "r3").exists() and not (tmp_path / "i").exists()


SETTINGS_OF = {
    "build-tiny-model": "gmc.run.tiny_model:TinyModelConfig",
    "build-random-model": "gmc.run.random_model:RandomModelConfig",
    "train": "gmc.run.config:TrainConfig",
    "history": "gmc.run.config:TrainConfig",
    "prefill": "gmc.run.config:TrainConfig",
    "plan-memory": "gmc.run.config:TrainConfig",
    "evaluate": "gmc.run.evaluate:EvalConfig",
    "gradient-lab": "gmc.theory.config:GradientLabConfig",
}
"""The settings class of each command that takes --set."""


def test_every_option_of_every_command_has_help_and_its_set_example_is_a_real_key():
    import argparse

    from gmc.cli import build_parser
    from gmc.settings import load_config, load_named

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in sub.choices.items():
        for action in command._actions:
            if action.help is not argparse.SUPPRESS and not isinstance(action, argparse._HelpAction):
                assert action.help, f"gmc {name} {'/'.join(action.option_strings) or action.dest}: no help text"
        examples = [
            re.search(r"\(([\w.]+=[^)]+)\)", a.help).group(1) for a in command._actions if a.dest == "overrides"
        ]
        assert bool(examples) == (name in SETTINGS_OF), name
        for example in examples:  # the --set example applies to this command's settings
            load_config(load_named(SETTINGS_OF[name]), None, [example])


def test_the_command_table_lists_every_command_and_its_options():
    import argparse

    from gmc.cli import build_parser

    table = (REPO / "docs" / "reference" / "cli.md").read_text()
    rows = {}
    for line in table.splitlines():
        if line.startswith("| `gmc "):
            for name in re.findall(r"`gmc ([a-z-]+)", line.split(" | ")[0]):
                rows[name] = rows.get(name, "") + line
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in sub.choices.items():
        assert name in rows, f"docs/reference/cli.md: no row for gmc {name}"
        for action in command._actions:
            for option in action.option_strings:
                if option.startswith("--") and action.help is not argparse.SUPPRESS and option != "--help":
                    assert option in rows[name], f"docs/reference/cli.md: gmc {name} lacks {option}"
