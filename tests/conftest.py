import os
from pathlib import Path

import pytest

from gmc.data import data_root

SHARED = data_root()


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The repository's local copies of the benchmarks; tests that need them skip without them."""
    if not (SHARED / "benchmarks").is_dir():
        pytest.skip(f"no local benchmark data at {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A briefly warm-started tiny policy, built once per test session."""
    from gmc.tiny import TinyModelConfig, build_tiny_model

    out = tmp_path_factory.mktemp("models") / "tiny"
    build_tiny_model(out, TinyModelConfig(max_steps=60, eval_every=30, eval_problems=16, batch_size=32),
                     progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_dir):
    from gmc.policy import load_policy

    return load_policy(str(tiny_model_dir), device="cpu")
