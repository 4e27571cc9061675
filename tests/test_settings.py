"""Settings: one error type that names the dotted key and what it allows."""

import pytest

from gmc.run.config import TrainConfig
from gmc.run.evaluate import EvalConfig
from gmc.settings import ConfigError, from_dict


def test_one_error_type_names_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError, match="model_dtype: must be 'float32', 'bfloat16' or 'float16', got 'float8'"):
        TrainConfig(model_dtype="float8")
    with pytest.raises(ConfigError, match=r"engine: unknown rollout engine 'sglang'; known: \['hf', 'vllm'\]"):
        from_dict(EvalConfig, {"engine": "sglang"})
    with pytest.raises(ConfigError, match=r"algorithm: unknown estimator 'ppo'; known: \['grpo'"):
        from_dict(TrainConfig, {"algorithm": "ppo"})
    with pytest.raises(ConfigError, match="sampling.max_new_tokens: must be a valid integer, got '48'"):
        from_dict(TrainConfig, {"sampling": {"max_new_tokens": "48"}})
    with pytest.raises(ConfigError, match=r"^estimator.epz: unknown key; did you mean 'eps'\?$"):
        from_dict(TrainConfig, {"estimator": {"epz": 1}})
    with pytest.raises(ConfigError, match=r"benchmarks\[1\]: unknown benchmark 'mmlu'"):
        from_dict(EvalConfig, {"benchmarks": ["math500", "mmlu"]})
