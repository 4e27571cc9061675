import os
from pathlib import Path

import pytest

from gmc.data import DEFAULT_DATA_ROOT_ENV, data_root

SHARED = data_root()


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The offline copy of the benchmarks and the MATH training split (``$GMC_DATA_ROOT``, else
    ``data/``); tests that need it skip without it, saying where to point the variable."""
    if not (SHARED / "benchmarks").is_dir():
        where = os.environ.get(DEFAULT_DATA_ROOT_ENV)
        why = f"{DEFAULT_DATA_ROOT_ENV}={where} has no benchmarks/" if where else f"{DEFAULT_DATA_ROOT_ENV} is unset"
        pytest.skip(f"no local data at {SHARED} ({why}): set {DEFAULT_DATA_ROOT_ENV} to a folder made by "
                    "`gmc prepare-data`")
    return SHARED


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A briefly warm-started tiny policy, built once per test session."""
    from gmc.policy import TinyModelConfig, build_tiny_model

    out = tmp_path_factory.mktemp("models") / "tiny"
    build_tiny_model(out, TinyModelConfig(max_steps=60, eval_every=30, eval_problems=16, batch_size=32),
                     progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_dir):
    from gmc.policy import load_policy

    return load_policy(str(tiny_model_dir), device="cpu")
