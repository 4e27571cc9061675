import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, sweep

from gmc.tasks.datasets import DEFAULT_DATA_ROOT_ENV, data_root

SHARED = data_root()
SMALL_RUN = dict(device="cpu", steps=3, group_size=4, prompts_per_step=3, checkpoint_every=0, seed=0)
"""A few-step training run of the tiny model (every key may be overridden)."""


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The offline copy of the benchmarks and the MATH training split (``$GMC_DATA_ROOT``, else
    ``data/``); tests that need it skip without it, saying where to point the variable."""
    if not (SHARED / "benchmarks").is_dir():
        where = os.environ.get(DEFAULT_DATA_ROOT_ENV)
        why = f"{DEFAULT_DATA_ROOT_ENV}={where} has no benchmarks/" if where else f"{DEFAULT_DATA_ROOT_ENV} is unset"
        pytest.skip(
            f"no local data at {SHARED} ({why}): set {DEFAULT_DATA_ROOT_ENV} to a folder made by `gmc prepare-data`"
        )
    return SHARED


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A briefly warm-started tiny policy, built once per test session."""
    from gmc.run.tiny_model import TinyModelConfig, build_tiny_model

    out = tmp_path_factory.mktemp("models") / "tiny"
    build_tiny_model(out, TinyModelConfig(max_steps=60, eval_every=30, eval_problems=16, batch_size=32), progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_dir):
    from gmc.policy.model import load_policy

    return load_policy(str(tiny_model_dir), device="cpu")


@pytest.fixture(scope="session")
def small_config(tiny_model_dir):
    """``small_config(**overrides)``: the :class:`TrainConfig` of a small run of the tiny model
    (:data:`SMALL_RUN`; dotted keys as ``**{"delay.d": 2}``), loaded as ``gmc train --set`` does."""
    from gmc.run.config import load_train_config

    def make(**overrides):
        values = {"model": str(tiny_model_dir), **SMALL_RUN, **overrides}
        return load_train_config(None, [f"{k}={v}" for k, v in values.items()])

    return make


@pytest.fixture(scope="session")
def train_small(small_config):
    """``train_small(out, **overrides)``: train a :func:`small_config` run into ``out``; returns
    its metrics lines."""
    from gmc.io import read_jsonl
    from gmc.run.trainer import Trainer

    def train(out, **overrides):
        Trainer(small_config(**overrides), out, progress=False).run()
        return read_jsonl(Path(out) / "metrics.jsonl")

    return train


@pytest.fixture(scope="session")
def snakemake():
    """``snakemake(args, cwd, timeout=600, env=None)``: the workflow run in a subprocess with this
    interpreter's environment first on PATH; returns the completed process (output captured)."""

    def run(args, cwd, timeout=600, env=None):
        environ = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **(env or {})}
        cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), *args]
        return subprocess.run(cmd, cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture(scope="session")
def load_workflow():
    """``load_workflow(folder, overwrite_resources=None, configfiles=())``: the workflow as Snakemake
    builds it in-process in ``folder`` as in a checkout (the default config.yaml copied there if it has
    none, the published bundles linked;
    ``configfiles`` given as with ``--configfile``), set-resources applied."""
    import shutil

    def load(folder, overwrite_resources=None, configfiles=()):
        from snakemake.api import SnakemakeApi
        from snakemake.settings.types import (
            ConfigSettings,
            OutputSettings,
            ResourceSettings,
            StorageSettings,
        )

        folder.mkdir(exist_ok=True)
        if not (folder / "config.yaml").exists():
            shutil.copy(REPO / "config.yaml", folder / "config.yaml")
        if not (folder / "published").exists():  # a preset that trains with a tuning sweep's choice reads it there
            (folder / "published").symlink_to(REPO / "published")
        cwd = os.getcwd()
        os.chdir(folder)
        try:
            with SnakemakeApi(OutputSettings()) as api:
                wf = api.workflow(
                    resource_settings=ResourceSettings(overwrite_resources=overwrite_resources or {}),
                    config_settings=ConfigSettings(configfiles=[Path(f) for f in configfiles]),
                    storage_settings=StorageSettings(),
                    snakefile=REPO / "Snakefile",
                    workdir=folder,
                )
                return wf._workflow
        finally:
            os.chdir(cwd)

    return load


@pytest.fixture(scope="session")
def load_rules(load_workflow):
    """``load_rules(folder, overwrite_resources=None)``: the default workflow's rules by name."""
    return lambda folder, overwrite_resources=None: {
        r.name: r for r in load_workflow(folder, overwrite_resources).rules
    }


@pytest.fixture
def make_run_dir():
    """Writes a finished run directory as the trainer leaves it (its files, no model) under
    ``<results>/train/algo~A/delay~D/group~4/seed~0``; ``start`` is the first line's wall-clock time."""

    def make(
        results: Path, algo: str = "gmc", delay: int = 0, steps: int = 3, start: float = 1.7e9, finished: bool = True
    ) -> Path:
        d = results / "train" / f"algo~{algo}" / f"delay~{delay}" / "group~4" / "seed~0"
        d.mkdir(parents=True, exist_ok=True)
        (d / "run.json").write_text(json.dumps({"run_id": f"{algo}-{delay}-{results.name}", "git_revision": "abc"}))
        (d / "config.yaml").write_text(f"algorithm: {algo}\nestimator:\n  eps: 0.2\n")
        rows = [
            {"step": s, "time": start + s, "rollout/reward_mean": 0.1 * s, "async/staleness_mean": delay}
            for s in range(steps)
        ]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        groups = [
            {
                "step": s,
                "version": s,
                "staleness": delay,
                "length_max": 10,
                "length_mean": 8.0,
                "reward_mean": 0.5,
                "submitted_at": 0.0,
                "completed_at": 1.0,
            }
            for s in range(steps)
        ]
        (d / "groups.jsonl").write_text("".join(json.dumps(g) + "\n" for g in groups))
        if finished:
            (d / "summary.json").write_text(json.dumps({"steps": steps, "rollout/reward_mean_last20": 0.1}))
        return d

    return make


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading a model fails the test: what is checked before it loads."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr("gmc.run.trainer.load_policy", refuse)
    monkeypatch.setattr("gmc.policy.model.load_policy", refuse)


@pytest.fixture()
def bundle(tmp_path):
    """A published bundle of :func:`helpers.sweep`."""
    out = tmp_path / "published"
    from gmc.results.bundles import publish

    publish(sweep(tmp_path / "results"), out)
    return out
