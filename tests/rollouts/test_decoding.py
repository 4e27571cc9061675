"""The rollout engine's KV-cache decoders against the full forward: shared prompt prefill,
finished rows dropped, the decoder chosen by architecture, and the cache's limits."""

import pytest
import torch
from helpers import prompts_for

from gmc.policy.model import (
    position_ids_from_mask,
)
from gmc.rollouts.decoding import HFDecoder, Qwen3Decoder, make_decoder


def decode_logits(decoder, ids, mask, copies, tokens, keep_at=None, keep=None):
    """Prefill, then feed ``tokens [N, k]`` one column at a time; drop to rows ``keep`` after
    ``keep_at`` steps. Returns the logits of each step, ``nan`` for dropped rows."""
    N, k = tokens.shape
    first = decoder.prefill(ids, mask, copies)
    out = torch.full((N, k + 1, first.shape[-1]), float("nan"))
    out[:, 0] = first
    rows = torch.arange(N)
    for j in range(k):
        if j == keep_at:
            decoder.keep(keep)
            rows = rows[keep]
        out[rows, j + 1] = decoder.step(tokens[rows, j])
    return out


@pytest.mark.parametrize("fp32_head", [False, True])
@pytest.mark.parametrize("kind", ["qwen3", "hf"])
def test_decoders_match_the_full_forward_with_shared_prefill_and_dropped_rows(tiny_policy, kind, fp32_head):
    model, tok = tiny_policy
    enc = tok(prompts_for(3, seed=4), return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    assert (mask == 0).any(), "the prompts differ in length, so some rows are left-padded"
    copies, k, P = 2, 6, ids.shape[1]
    tokens = torch.randint(
        2, model.config.vocab_size, (len(ids) * copies, k), generator=torch.Generator().manual_seed(0)
    )
    full_ids = torch.cat([ids.repeat_interleave(copies, 0), tokens], 1)
    full_mask = torch.cat([mask.repeat_interleave(copies, 0), torch.ones_like(tokens)], 1)
    keep = torch.tensor([0, 3, 5])
    with torch.inference_mode():
        ref = model(input_ids=full_ids, attention_mask=full_mask, position_ids=position_ids_from_mask(full_mask)).logits
        decoder = Qwen3Decoder(model, P + k, fp32_head) if kind == "qwen3" else HFDecoder(model, fp32_head)
        got = decode_logits(decoder, ids, mask, copies, tokens, keep_at=3, keep=keep)
    ref = ref[:, P - 1 :]
    torch.testing.assert_close(got[:, :4], ref[:, :4], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[keep, 4:], ref[keep, 4:], rtol=1e-4, atol=1e-4)
    assert got[[1, 2, 4], 4:].isnan().all()


def test_decoder_choice_and_cache_limits(tiny_policy):
    from transformers import LlamaConfig, LlamaForCausalLM

    model, tok = tiny_policy
    assert Qwen3Decoder.supports(model) and isinstance(make_decoder(model, 8), Qwen3Decoder)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=model.config.vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    assert not Qwen3Decoder.supports(llama) and isinstance(make_decoder(llama, 8), HFDecoder)
    decoder = Qwen3Decoder(model, capacity=4)
    ids = torch.ones(1, 3, dtype=torch.long)
    with torch.inference_mode():
        decoder.prefill(ids, torch.ones_like(ids))
        decoder.step(torch.ones(1, dtype=torch.long))
        with pytest.raises(ValueError, match="4 positions"):
            decoder.step(torch.ones(1, dtype=torch.long))


@pytest.mark.parametrize("kind", ["qwen3", "hf"])
def test_an_fp32_head_keeps_the_logits_float32_under_bfloat16_autocast(tiny_policy, kind):
    """Under bfloat16 autocast the head rounds the logits to bfloat16; with ``fp32_head`` they
    are float32, as ``head_logits`` in float32 of the same hidden states gives them."""
    model, tok = tiny_policy
    enc = tok(prompts_for(2, seed=5), return_tensors="pt", padding=True, add_special_tokens=False)
    P = enc["input_ids"].shape[1]
    make = (lambda fp32: Qwen3Decoder(model, P + 1, fp32)) if kind == "qwen3" else (lambda fp32: HFDecoder(model, fp32))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        plain = make(False).prefill(enc["input_ids"], enc["attention_mask"])
        fp32 = make(True).prefill(enc["input_ids"], enc["attention_mask"])
    assert plain.dtype == torch.bfloat16 and fp32.dtype == torch.float32
    assert fp32.shape == plain.shape and torch.isfinite(fp32).all()
    assert 0 < float((plain.float() - fp32).abs().max()) < 0.1
