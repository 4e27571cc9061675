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
