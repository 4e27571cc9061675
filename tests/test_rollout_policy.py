"""The policy's log-probs, the tiny model builder and the HF rollout engine."""

import json

import pytest
import torch

from gmc.data import PLAIN_TEMPLATE, SyntheticTask
from gmc.policy import load_policy, response_logprobs, token_logprobs_from_hidden
from gmc.rollout import HFEngine, SamplingConfig, make_engine


def prompts_for(n, seed=0):
    return [PLAIN_TEMPLATE.format(problem=r.problem) for r in SyntheticTask().generate("test", n, seed=seed)]


def test_chunked_logprobs_equal_naive_and_gradients_match():
    torch.manual_seed(0)
    N, T, H, V = 3, 7, 16, 1000
    hidden = torch.randn(N, T, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    targets = torch.randint(0, V, (N, T))
    naive = torch.log_softmax(hidden @ weight.T, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    chunked = token_logprobs_from_hidden(weight, hidden, targets, chunk_size=4)
    torch.testing.assert_close(chunked, naive, rtol=1e-5, atol=1e-5)
    g1 = torch.autograd.grad(naive.sum(), (hidden, weight))
    g2 = torch.autograd.grad(chunked.sum(), (hidden, weight))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_tiny_model_reloads_with_identical_logits(tiny_model_dir, tiny_policy):
    summary = json.loads((tiny_model_dir / "build_summary.json").read_text())
    assert summary["steps"] > 0 and 0.0 <= summary["greedy_accuracy"] <= 1.0
    model, tok = tiny_policy
    assert model.config.model_type == "qwen3" and tok.padding_side == "left"
    again, _ = load_policy(str(tiny_model_dir), device="cpu")
    ids = tok(prompts_for(2), return_tensors="pt", padding=True)
    with torch.no_grad():
        a = model(**ids).logits
        b = again(**ids).logits
    assert torch.equal(a, b)


def test_sampler_logprobs_match_recomputed_policy_logprobs(tiny_policy):
    model, tok = tiny_policy
    engine = HFEngine(model, tok, seed=1)
    prompts = prompts_for(3)
    groups = engine.generate(prompts, 4, SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=24))
    flat = [s for g in groups for s in g]
    P = max(len(s.prompt_ids) for s in flat)
    T = max(s.length for s in flat)
    pad = tok.pad_token_id
    ids = torch.full((len(flat), P + T), pad)
    attn = torch.zeros(len(flat), P + T, dtype=torch.long)
    for i, s in enumerate(flat):
        ids[i, P - len(s.prompt_ids) : P] = torch.tensor(s.prompt_ids)
        ids[i, P : P + s.length] = torch.tensor(s.token_ids)
        attn[i, P - len(s.prompt_ids) : P + s.length] = 1
    with torch.no_grad():
        lp = response_logprobs(model, ids, attn, P)
    for i, s in enumerate(flat):
        torch.testing.assert_close(lp[i, : s.length], torch.tensor(s.logprobs), rtol=0, atol=1e-4)


def test_engine_is_reproducible_for_a_seed(tiny_policy):
    model, tok = tiny_policy
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=16)
    a = HFEngine(model, tok, seed=7).generate(prompts_for(2), 3, sampling)
    b = HFEngine(model, tok, seed=7).generate(prompts_for(2), 3, sampling)
    c = HFEngine(model, tok, seed=8).generate(prompts_for(2), 3, sampling)
    key = lambda gs: [s.token_ids for g in gs for s in g]  # noqa: E731
    assert key(a) == key(b)
    assert key(a) != key(c)


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
    from gmc.rollout import _sample_next

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    gen = torch.Generator().manual_seed(0)
    tok, lp = _sample_next(logits, SamplingConfig(top_p=0.7), gen)
    assert set(tok.tolist()) == {0, 1}
    torch.testing.assert_close(lp[tok == 0][0], torch.log(torch.tensor(0.5 / 0.8)))


def test_sampling_config_and_engine_errors():
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="'hf' or 'vllm'"):
        make_engine("sglang", None, None)


def test_vllm_engine_without_vllm_names_the_extra():
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
    except ImportError:
        from gmc.rollout import VLLMEngine

        with pytest.raises(ImportError, match=r"gmc\[gpu\]"):
            VLLMEngine("any")
    else:
        pytest.skip("vLLM is installed")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and vLLM")
def test_vllm_engine_generates_and_syncs(tiny_model_dir):
    from gmc.rollout import VLLMEngine

    model, tok = load_policy(str(tiny_model_dir), device="cuda")
    engine = VLLMEngine(str(tiny_model_dir), dtype="float32", gpu_memory_utilization=0.2)
    groups = engine.generate(prompts_for(2), 2, SamplingConfig(max_new_tokens=16))
    assert len(groups) == 2 and all(len(g) == 2 for g in groups)
    assert all(len(s.logprobs) == s.length for g in groups for s in g)
    engine.sync_weights(model)
