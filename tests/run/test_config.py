"""TrainConfig: nonsense values refused naming the key and where the value came from (a file or
``--set``), and the token limit's one home."""

import json
import re

import pytest

from gmc.run.config import TrainConfig, load_train_config
from gmc.settings import ConfigError, from_dict, to_dict


@pytest.mark.parametrize(
    "item, key",
    [
        ("max_grad_norm=-1", "max_grad_norm"),
        ("max_grad_norm=0", "max_grad_norm"),
        ("sampling.temperature=.nan", "sampling.temperature"),
        ("sampling.temperature=0", "sampling.temperature"),
        ("sampling.temperature=11", "sampling.temperature"),
        ("seed=-1", "seed"),
        ("logprob_chunk_size=0", "logprob_chunk_size"),
        ("lr=.nan", "lr"),
        ("lr=.inf", "lr"),
        ("weight_decay=.nan", "weight_decay"),
        ("weight_decay=-0.1", "weight_decay"),
        ("warmup_steps=-1", "warmup_steps"),
        ("estimator.is_log_ratio_clamp=.nan", "estimator"),
        ("delay.beta=.nan", "delay"),
    ],
)
def test_nonsense_values_are_refused_naming_the_key(tmp_path, item, key):
    config = tmp_path / "c.yaml"
    config.write_text("steps: 10\n")
    with pytest.raises(ConfigError, match=rf"^--set {re.escape(item)}: .*{re.escape(key)}"):
        load_train_config(config, [item])


def test_bad_values_in_the_file_are_blamed_on_the_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("seed: -1\nmax_grad_norm: -1\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: seed"):
        load_train_config(config, ["lr=1e-4"])
    with pytest.raises(ConfigError, match=r"c\.yaml: max_grad_norm"):
        load_train_config(config, ["seed=0"])  # fixes one value; the file's other is still bad
    with pytest.raises(ConfigError, match=r"^--set max_grad_norm=-2: max_grad_norm"):
        load_train_config(config, ["seed=0", "max_grad_norm=-2"])
    with pytest.raises(ConfigError, match=r"--set lr=\[1: invalid YAML"):
        load_train_config(config, ["lr=[1"])
    with pytest.raises(ConfigError, match=r"--set seed.x=1: seed is not a mapping"):
        load_train_config(config, ["seed.x=1"])


def test_the_token_limit_has_one_home_and_one_default():
    """``sampling.max_new_tokens``: the generation's limit and the ``seq_sum_const`` divisor alike."""
    from gmc.rollouts.engines import SamplingConfig

    assert TrainConfig().sampling == SamplingConfig() and SamplingConfig().max_new_tokens == 48
    cfg = from_dict(TrainConfig, {"sampling": {"max_new_tokens": 100}})
    assert "max_new_tokens" not in to_dict(cfg)["estimator"]
    with pytest.raises(ConfigError, match=r"estimator.max_new_tokens: unknown key"):
        from_dict(TrainConfig, {"estimator": {"max_new_tokens": 512}})
    # a resolved config (as written into a run directory) loads again
    assert from_dict(TrainConfig, to_dict(cfg)) == cfg


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="estimator.epz: unknown key"):
        load_train_config(None, ["estimator.epz=0.1"])
    with pytest.raises(ConfigError, match="group_size: must be a valid integer, got 'eight'"):
        load_train_config(None, ["group_size=eight"])
    with pytest.raises(ConfigError, match="algorithm: unknown estimator 'ppo'"):
        load_train_config(None, ["algorithm=ppo"])
    with pytest.raises(ConfigError, match="delay"):
        load_train_config(None, ["delay.mode=async"])
    bad = tmp_path / "c.yaml"
    bad.write_text("steps: 10\nlr: [1\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: invalid YAML"):
        load_train_config(bad)
    bad.write_text("stepz: 10\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: stepz: unknown key"):
        load_train_config(bad)
    cfg = load_train_config(None, ["lr=2e-4", "estimator.eps=0.1", "synthetic.max_operands=3"])
    assert isinstance(cfg, TrainConfig) and cfg.lr == 2e-4 and cfg.estimator.eps == 0.1
    assert json.dumps(cfg.synthetic.max_operands) == "3"
