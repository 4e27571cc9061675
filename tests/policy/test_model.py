"""The policy: chunked LM-head log-probs against a naive computation, and a saved tiny model
that reloads with identical logits."""

import json

import torch
from helpers import prompts_for

from gmc.policy.model import (
    load_policy,
    token_logprobs_from_hidden,
)


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


def test_an_fp32_head_rounds_logits_as_float32_whatever_the_autocast():
    """Under bfloat16 autocast the head's matmul rounds to bfloat16; ``fp32_head`` computes it in
    float32, equal to the float32 computation on the same (bfloat16-rounded) hidden states."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(300, 64, generator=g) * 0.1
    hidden = torch.randn(2, 9, 64, generator=g).to(torch.bfloat16).float()
    targets = torch.randint(0, 300, (2, 9), generator=g)
    exact = token_logprobs_from_hidden(weight, hidden, targets, chunk_size=5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rounded = token_logprobs_from_hidden(weight, hidden, targets, chunk_size=5)
        fp32 = token_logprobs_from_hidden(weight, hidden, targets, chunk_size=5, fp32_head=True)
    torch.testing.assert_close(fp32, exact, rtol=0, atol=1e-5)
    assert float((rounded - exact).abs().max()) > 1e-3
