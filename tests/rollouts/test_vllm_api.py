"""The vLLM engine against vLLM 0.33's API, on any machine: :class:`gmc.rollouts.vllm_engine.VLLMEngine` and a
training run driven through :mod:`vllm_standin`, which has the signatures and sleep rules of
vLLM 0.33 (``make test-vllm`` runs the engine on vLLM's real CPU build; the GPU check on CUDA).
What is checked: the calls and their arguments, and the hand-over of the device between vLLM and
the update (sleep level 2 before every update, the trainer's cached blocks released before every
wake-up, weights reloaded before the next generation)."""

import sys

import pytest
import torch
import vllm_standin

from gmc.io import read_jsonl
from gmc.rollouts.engines import SamplingConfig, VLLMConfig, make_engine
from gmc.run.trainer import Trainer


@pytest.fixture
def vllm(monkeypatch):
    """The stand-in as ``vllm`` for one test, its event log cleared."""
    monkeypatch.setitem(sys.modules, "vllm", vllm_standin)
    vllm_standin.EVENTS.clear()
    return vllm_standin


def calls(names=None):
    return [e[0] for e in vllm_standin.EVENTS if names is None or e[0] in names]


def test_the_engine_builds_samples_and_reloads_as_vllm_0_33_takes_it(vllm, tiny_policy, tiny_model_dir):
    model, tok = tiny_policy
    engine = make_engine(
        "vllm",
        model,
        tok,
        model_path=str(tiny_model_dir),
        seed=3,
        settings=VLLMConfig(sleep=True, max_model_len=256),
        dtype="float32",
    )
    ((_, built),) = vllm.EVENTS
    assert built["logprobs_mode"] == "processed_logprobs" and built["enable_sleep_mode"] and built["dtype"] == "float32"
    groups = engine.generate(["Compute 1+1.", "Compute 2+2."], 3, SamplingConfig(max_new_tokens=8))
    assert [len(g) for g in groups] == [3, 3] and all(s.logprobs == [-1.0] * s.length for g in groups for s in g)
    engine.release_memory()
    with pytest.raises(RuntimeError, match="sync_weights"):
        engine.generate(["Compute 1+1."], 1, SamplingConfig(max_new_tokens=8))
    released = []
    engine.release_cached = lambda: released.append(len(vllm.EVENTS))
    engine.sync_weights(model)
    engine.generate(["Compute 1+1."], 1, SamplingConfig(max_new_tokens=8))
    assert calls() == ["LLM", "generate", "sleep", "wake_up", "reload_weights", "wake_up", "generate"]
    assert [e[1] for e in vllm.EVENTS if e[0] in ("sleep", "wake_up")] == [
        {"level": 2},
        {"tags": ["weights"]},
        {"tags": None},
    ]
    assert released == [3, 5]  # right before each wake-up
    reload = vllm.EVENTS[4][1]
    assert reload == {"tensors": len(model.state_dict()), "dtypes": ["float32"], "is_checkpoint_format": True}


def test_weights_reach_vllm_in_its_dtype(vllm, tiny_policy, tiny_model_dir):
    """float32 masters are handed over as the engine's bfloat16, converted one tensor at a time
    (a generator, not a list of copies), and the trainer's own weights stay float32."""
    model, tok = tiny_policy
    engine = make_engine("vllm", model, tok, model_path=str(tiny_model_dir), settings=VLLMConfig(), dtype="bfloat16")
    handed = []
    engine.llm.collective_rpc = lambda method, kwargs: handed.append(kwargs["weights_iterator"])
    engine.sync_weights(model)
    (weights,) = handed
    assert not isinstance(weights, list | tuple)
    tensors = dict(weights)
    assert set(tensors) == set(model.state_dict()) and {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert all(torch.equal(tensors[k], v.to(torch.bfloat16)) for k, v in model.state_dict().items())
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_without_sleep_the_prefix_cache_is_reset_after_every_reload(vllm, tiny_policy, tiny_model_dir):
    model, tok = tiny_policy
    engine = make_engine("vllm", model, tok, model_path=str(tiny_model_dir), settings=VLLMConfig(), dtype="float32")
    engine.generate(["Compute 1+1."], 2, SamplingConfig(max_new_tokens=8))
    engine.release_memory()  # nothing to hand over: no sleep mode
    engine.sync_weights(model)
    assert calls() == ["LLM", "generate", "reload_weights", "reset_prefix_cache"]
    assert not engine.llm.prefix_cache


@pytest.mark.parametrize("delay", [{"delay.d": 0}, {"delay.d": 2}])
def test_a_training_run_hands_the_device_to_each_update_and_back(vllm, tmp_path, small_config, delay):
    """Every step: the batch is generated awake, vLLM sleeps at level 2 before the update, the
    weights wake (after the cached blocks are released) for the reload, the KV cache for the
    next generation; no generation ever meets discarded weights."""
    trainer = Trainer(
        small_config(engine="vllm", **{"vllm.sleep": True, "behaviour_logprobs": "sampler"}, **delay),
        tmp_path / "run",
        progress=False,
    )
    trainer.engine.release_cached = lambda: vllm.EVENTS.append(("empty_cache", {}))
    trainer.run()
    steps = len(read_jsonl(tmp_path / "run" / "metrics.jsonl"))
    events = calls()
    assert events.count("sleep") == steps and events.count("reload_weights") == steps
    assert all(e[1] == {"level": 2} for e in vllm.EVENTS if e[0] == "sleep")
    for i, name in enumerate(events):
        if name == "wake_up":
            assert events[i - 1] == "empty_cache", events[i - 3 : i + 1]
        if name == "sleep":  # the update follows; then the weights wake and are reloaded
            assert events[i + 1 : i + 4] == ["empty_cache", "wake_up", "reload_weights"], events[i : i + 4]
    assert "reset_prefix_cache" not in events  # every reload happens asleep: the sleep cleared the cache
