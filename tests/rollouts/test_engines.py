"""The rollout engines: sampler log-probs against the trainer's, answers continued across a
weight update, the sampling distribution, per-sample random streams, end-of-turn ids, limits
and errors, and the engine registry (a new engine needs only its entry)."""

import pytest
import torch
from helpers import prompts_for, recomputed_logprobs

from gmc.rollouts.engines import SamplingConfig, VLLMConfig, make_engine
from gmc.rollouts.hf_engine import HFEngine
from gmc.rollouts.streams import _mix, end_token_ids, sample_next, stream_keys, stream_uniforms
from gmc.run.config import TrainConfig
from gmc.run.evaluate import EvalConfig

CALLS: list[int] = []


def counting_engine(model, tokenizer, model_path, seed, settings, dtype, fp32_head):
    """An engine that samples like the HF engine and counts its calls."""
    from gmc.rollouts.hf_engine import HFEngine

    class Counting(HFEngine):
        def generate(self, prompts, n, sampling):
            CALLS.append(len(prompts))
            return super().generate(prompts, n, sampling)

    return Counting(model, tokenizer, seed=seed)


def test_a_new_rollout_engine_needs_only_its_registry_entry(tmp_path, monkeypatch, train_small):
    from gmc.rollouts.engines import ENGINES, Engine

    CALLS.clear()
    monkeypatch.setitem(
        ENGINES, "counting", Engine(f"{__name__}:counting_engine", "counting HF engine", ("cpu",), shares_model=True)
    )
    metrics = train_small(tmp_path / "run", steps=2, engine="counting", **{"delay.d": 1})
    assert len(metrics) == 2 and CALLS == [3, 3, 3]  # the prefill batch and one per step
    plain = train_small(tmp_path / "plain", steps=2, **{"delay.d": 1})
    assert [r["train/loss"] for r in metrics] == [r["train/loss"] for r in plain]


def test_every_engine_with_settings_has_them_under_its_name_in_train_and_evaluate_configs():
    import typing

    from gmc.rollouts.engines import ENGINES

    for name, entry in ENGINES.items():
        assert entry.label and entry.devices and entry.make.count(":") == 1
        if entry.settings is not None:
            for cls in (TrainConfig, EvalConfig):
                assert typing.get_type_hints(cls)[name] is entry.settings, (name, cls.__name__)


def test_sampler_logprobs_match_recomputed_policy_logprobs(tiny_policy):
    model, tok = tiny_policy
    engine = HFEngine(model, tok, seed=1)
    groups = engine.generate(prompts_for(3), 4, SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=24))
    flat = [s for g in groups for s in g]
    assert len({s.length for s in flat}) > 1, "answers of different lengths: rows leave the batch at different steps"
    lp = recomputed_logprobs(model, tok, flat)
    for i, s in enumerate(flat):
        torch.testing.assert_close(lp[i, : s.length], torch.tensor(s.logprobs), rtol=0, atol=1e-4)


@pytest.mark.parametrize("when", ["first token", "rows left"])
def test_answers_continued_across_a_weight_update_have_each_versions_log_probs(tiny_policy, when):
    """Partial rollouts: new weights taken in after the first token, or once a quarter of the
    answers have ended and left the batch. Every token is recorded with the version that sampled
    it, and its log-prob is that version's own (a full forward of prompt and answer so far with
    those weights), before and after the switch."""
    import copy

    model, tok = tiny_policy
    prompts, sampling = prompts_for(3, seed=5), SamplingConfig(max_new_tokens=24)
    lengths = sorted(s.length for g in HFEngine(model, tok, seed=2).generate(prompts, 4, sampling) for s in g)
    switch_at = 1 if when == "first token" else lengths[len(lengths) // 4] + 1  # the same tokens until then
    policy, newer = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad():
        for p in newer.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    engine = HFEngine(policy, tok, seed=2)
    engine.version, steps = 3, []

    def newer_weights():
        steps.append(len(steps))
        if len(steps) == switch_at:
            policy.load_state_dict(newer.state_dict())
            return 4
        return None

    engine.newer_weights = newer_weights
    flat = [s for g in engine.generate(prompts, 4, sampling) for s in g]
    assert any(s.length > switch_at for s in flat)
    for s in flat:
        assert s.versions == [3] * min(s.length, switch_at) + [4] * max(0, s.length - switch_at)
    before, after = recomputed_logprobs(model, tok, flat), recomputed_logprobs(newer, tok, flat)
    for i, s in enumerate(flat):
        own = torch.where(torch.tensor(s.versions) == 3, before[i, : s.length], after[i, : s.length])
        torch.testing.assert_close(torch.tensor(s.logprobs), own, rtol=0, atol=1e-4)
    assert engine.version == 4


def test_engine_with_another_architecture_samples_the_policy(tiny_policy):
    """A non-Qwen3 model goes through its own forward; the sampler's log-probs are still the policy's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tok = tiny_policy
    torch.manual_seed(0)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    ).eval()
    groups = HFEngine(llama, tok, seed=0).generate(prompts_for(2), 3, SamplingConfig(max_new_tokens=10))
    flat = [s for g in groups for s in g]
    lp = recomputed_logprobs(llama, tok, flat)
    for i, s in enumerate(flat):
        torch.testing.assert_close(lp[i, : s.length], torch.tensor(s.logprobs), rtol=0, atol=1e-4)


def test_sampling_follows_the_distribution_and_never_picks_a_zero_probability_token():
    probs = torch.tensor([0.0, 0.5, 0.3, 0.2, 0.0])
    logits = probs.log().repeat(40_000, 1)
    rows = torch.arange(len(logits))
    tok, lp = sample_next(logits, SamplingConfig(), stream_uniforms(stream_keys(0, 0, rows, rows * 0), 0))
    freq = torch.bincount(tok, minlength=5).float() / len(tok)
    assert freq[0] == 0 and freq[4] == 0
    torch.testing.assert_close(freq, probs, rtol=0, atol=0.01)
    torch.testing.assert_close(lp, probs.log()[tok])


def test_engine_is_reproducible_for_a_seed(tiny_policy):
    model, tok = tiny_policy
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=16)
    a = HFEngine(model, tok, seed=7).generate(prompts_for(2), 3, sampling)
    b = HFEngine(model, tok, seed=7).generate(prompts_for(2), 3, sampling)
    c = HFEngine(model, tok, seed=8).generate(prompts_for(2), 3, sampling)
    key = lambda gs: [s.token_ids for g in gs for s in g]  # noqa: E731
    assert key(a) == key(b)
    assert key(a) != key(c)


def splitmix64_reference(x: int) -> int:
    """splitmix64's output function on Python integers (Steele et al., 2014; Vigna's C code)."""
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_stream_hash_is_splitmix64_with_wrapping_int64_arithmetic():
    xs = [0, 1, 2, 12345, 2**62 + 7, 2**63 - 1, -1, -(2**63), -987654321]
    got = _mix(torch.tensor(xs, dtype=torch.long)).tolist()
    assert [g & ((1 << 64) - 1) for g in got] == [splitmix64_reference(x & ((1 << 64) - 1)) for x in xs]
    # the first outputs of Vigna's splitmix64.c seeded with 0 (state advances by the golden ratio)
    assert splitmix64_reference(0) == 0xE220A8397B1DCDAF
    u = stream_uniforms(stream_keys(3, 0, torch.arange(10_000), torch.zeros(10_000, dtype=torch.long)), 0)
    assert u.dtype == torch.float32 and (u > 0).all() and (u <= 1).all()


def test_streams_are_independent_across_prompts_samples_and_calls():
    """Old vLLM seeding (one seed per call, sample j on seed + j) gave sample j of every prompt
    one stream, and call c's sample j+1 the stream of call c+1's sample j: here the correlation
    of any two streams over their positions is sampling noise, and no stream repeats."""
    calls, prompts, samples, T = 3, 64, 8, 256
    c, p, j = torch.meshgrid(torch.arange(calls), torch.arange(prompts), torch.arange(samples), indexing="ij")
    keys = torch.stack([stream_keys(0, int(ci), p[ci].flatten(), j[ci].flatten()) for ci in range(calls)]).flatten()
    assert keys.unique().numel() == keys.numel()
    u = torch.stack([stream_uniforms(keys, t) for t in range(T)], dim=1).double()  # [streams, T]
    assert abs(u.mean() - 0.5) < 0.002 and abs(u.var() - 1 / 12) < 0.001
    corr = torch.corrcoef(u)
    off = corr[~torch.eye(len(u), dtype=torch.bool)]
    # T positions: each correlation ~ N(0, 1/T); the largest of ~2.4e6 pairs stays below 6 sd
    assert off.abs().max() < 6 / T**0.5
    assert abs(off.mean()) < 1e-3
    same_sample = corr.view(calls, prompts, samples, calls, prompts, samples)[0, :, 0, 0, :, 0]
    assert same_sample[~torch.eye(prompts, dtype=torch.bool)].abs().mean() < 2 / T**0.5
    # a stream's positions are independent draws too (lag-1 autocorrelation)
    lag = ((u[:, 1:] - 0.5) * (u[:, :-1] - 0.5)).mean() * 12
    assert abs(lag) < 0.01


def test_samples_do_not_depend_on_batch_size_and_resume_from_the_call_counter(tiny_policy):
    model, tok = tiny_policy
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=12)
    key = lambda gs: [s.token_ids for g in gs for s in g]  # noqa: E731
    a = HFEngine(model, tok, seed=5)
    first, second = a.generate(prompts_for(3), 3, sampling), a.generate(prompts_for(3), 3, sampling)
    assert a.generator_state() == {"seed": 5, "calls": 2}
    small = HFEngine(model, tok, seed=5, batch_size=2)  # one prompt per batch
    assert key(small.generate(prompts_for(3), 3, sampling)) == key(first)
    resumed = HFEngine(model, tok, seed=0)
    resumed.set_generator_state({"seed": 5, "calls": 1})
    assert key(resumed.generate(prompts_for(3), 3, sampling)) == key(second)
    assert key(first) != key(second)
    with pytest.raises(ValueError, match="'seed' and 'calls'"):
        resumed.set_generator_state(torch.zeros(8, dtype=torch.uint8))


def test_one_prompt_twice_in_a_call_gets_two_independent_groups(tiny_policy):
    model, tok = tiny_policy
    prompt = prompts_for(1)[0]
    groups = HFEngine(model, tok, seed=0).generate(
        [prompt, prompt], 4, SamplingConfig(temperature=2.0, max_new_tokens=12)
    )
    assert [s.token_ids for s in groups[0]] != [s.token_ids for s in groups[1]]
    assert len({tuple(s.token_ids) for g in groups for s in g}) == 8


def chatml_tokenizer(tok):
    """The tiny tokenizer with Qwen3's chat markers and a ChatML chat template."""
    import copy

    chat = copy.deepcopy(tok)
    chat.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    chat.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return chat


def test_every_end_of_turn_id_stops_an_answer(tiny_policy):
    """A model whose generation config lists two end ids and whose chat template ends turns
    with <|im_end|>: all three are end ids, and an answer stops at the generation config's
    second id (a token the model emits)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    _, tiny_tok = tiny_policy
    tok = chatml_tokenizer(tiny_tok)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    ).eval()
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=12)
    prompts = prompts_for(3)
    free = HFEngine(model, tok).generate(prompts, 1, greedy)
    assert all(g[0].finish_reason == "length" for g in free), "a random model runs to the token limit"
    stop = free[0][0].token_ids[3]  # a token the model emits: made an end id below
    model.generation_config.eos_token_id = [tok.eos_token_id, stop]
    assert end_token_ids(tok, model) == {tok.eos_token_id, stop, im_end}
    assert end_token_ids(tiny_tok) == {tiny_tok.eos_token_id}  # no template, no generation config
    stopped = HFEngine(model, tok).generate(prompts, 1, greedy)
    for before, after in zip(free, stopped):
        toks = before[0].token_ids
        if stop in toks:
            end = toks.index(stop) + 1
            assert after[0].token_ids == toks[:end] and after[0].finish_reason == "stop"
        else:
            assert after[0].token_ids == toks and after[0].finish_reason == "length"


def test_eos_and_length_limits(tiny_policy):
    model, tok = tiny_policy
    engine = HFEngine(model, tok, seed=0)
    groups = engine.generate(prompts_for(4), 2, SamplingConfig(temperature=1.0, max_new_tokens=3))
    for s in (s for g in groups for s in g):
        assert s.length <= 3 and len(s.logprobs) == s.length
        if s.finish_reason == "stop":
            assert s.token_ids[-1] == tok.eos_token_id
        else:
            assert s.length == 3 and tok.eos_token_id not in s.token_ids
    greedy = engine.generate(prompts_for(4), 1, SamplingConfig(temperature=0.0, max_new_tokens=64))
    stopped = [g[0] for g in greedy if g[0].finish_reason == "stop"]
    assert stopped, "the warm-started model ends its answers with EOS"
    for s in stopped:
        assert s.token_ids.count(tok.eos_token_id) == 1 and s.token_ids[-1] == tok.eos_token_id


def test_top_p_restricts_to_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    rows = torch.arange(len(logits))
    tok, lp = sample_next(logits, SamplingConfig(top_p=0.7), stream_uniforms(stream_keys(0, 0, rows * 0, rows), 3))
    assert set(tok.tolist()) == {0, 1}
    torch.testing.assert_close(lp[tok == 0][0], torch.log(torch.tensor(0.5 / 0.8)))


def test_sampling_config_and_engine_errors():
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VLLMConfig(gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="vllm.dtype"):
        VLLMConfig(dtype="int8")
    with pytest.raises(ValueError, match=r"engine: unknown rollout engine 'sglang'; known: \['hf', 'vllm'\]"):
        make_engine("sglang", None, None)


def test_vllm_engine_without_vllm_names_the_extra():
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
    except ImportError:
        from gmc.rollouts.vllm_engine import VLLMEngine

        with pytest.raises(ImportError, match=r"gmc\[gpu\]"):
            VLLMEngine("any")
    else:
        pytest.skip("vLLM is installed")
