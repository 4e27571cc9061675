"""One update (gmc.update.Update.backward: the no-grad pass, the whole-batch loss, the
micro-batched backward) with ``attention: causal`` (right-padded rows, no mask: SDPA's causal
kernels) against ``attention: masked`` (the explicit padding mask, the previous path), on the
same rows, interleaved; the largest log-prob difference between them; each pass's share of the
step; and, on a GPU, the model-FLOPs utilisation (6 x parameters x tokens per second over the
dense bf16 matmul rate measured on the same GPU in the same run).

CPU (default): a random Qwen3 of hidden 256, 4 layers, vocabulary 4,096, 16 stale rows of
300-1,000 tokens, budget 4,096, float32. GPU (``--gpu``): a random Qwen3-4B shape in bfloat16
over float32 masters with checkpointing, budget 16,384, rows of 4,160 tokens; ``--micro-batches
N`` times N micro-batches of the backward and extrapolates to the 1,024-row step.

    python bench/update.py [--gpu] [--micro-batches 4]
"""

from __future__ import annotations

import argparse
import time

import torch
from common import interleaved, random_qwen3, write_result

from gmc.asynchrony import Group
from gmc.estimators import EstimatorConfig, get_estimator
from gmc.memory import ModelShape
from gmc.update import Rows, Update, _forward, micro_batches, precision, sequence_logprobs


def groups(vocab: int, B: int, G: int, lengths, prompt: int, seed: int = 0) -> list[Group]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for b in range(B):
        n = lengths[b]
        out.append(Group(prompt_index=b, prompt_ids=torch.randint(0, vocab, (prompt,), generator=gen),
                         response_ids=torch.randint(0, vocab, (G, max(n)), generator=gen),
                         response_mask=torch.arange(max(n))[None] < torch.tensor(n)[:, None],
                         rewards=(torch.arange(G) % 2).float(), behaviour_logp=-torch.rand(G, max(n), generator=gen) * 5,
                         sampler_logp=torch.zeros(G, max(n)), version=0))
    return out


def matmul_tflops(device, dtype=torch.bfloat16, n: int = 8192) -> float:
    """Dense matmul rate of this device (TFLOP/s), median of 10."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for _ in range(12):
        torch.cuda.synchronize()
        t = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return 2 * n**3 / sorted(times[2:])[5] / 1e12


def measure(gpu: bool = False, micro_batches_timed: int = 4, rounds: int = 5) -> dict:
    """The comparison of the module docstring; returns what ``main`` writes."""
    torch.manual_seed(0)
    if gpu:
        shape = ModelShape.of("Qwen/Qwen3-4B")
        dtype, budget, device = torch.bfloat16, 16384, "cuda"
        per = budget // 4608  # rows of 64 + 4,096 tokens pad to 4,608: three per micro-batch
        batch = groups(shape.vocab_size, 1, per * micro_batches_timed, [[4096] * (per * micro_batches_timed)], 64)
    else:
        shape = ModelShape(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=64, vocab_size=4096, tie_word_embeddings=True)
        dtype, budget, device = None, 4096, "cpu"
        lengths = torch.randint(250, 950, (4, 4), generator=torch.Generator().manual_seed(1)).tolist()
        batch = groups(shape.vocab_size, 4, 4, lengths, 50)
    model = random_qwen3(shape, device, checkpointing=gpu)
    params = sum(p.numel() for p in model.parameters())
    rows = Rows.from_groups(batch)
    tokens = sum(len(s) for s in rows.sequences)
    updates = {att: Update(model, get_estimator("gmc"), EstimatorConfig(max_new_tokens=1024), budget, pad_id=0,
                           chunk_size=1024, compute_dtype=dtype, attention=att) for att in ("masked", "causal")}

    def step(att):
        def run():
            updates[att].backward(batch, on_policy=False)
            model.zero_grad(set_to_none=True)
            if gpu:
                torch.cuda.synchronize()
        return run

    timed = interleaved({att: step(att) for att in updates}, rounds=rounds)
    with torch.no_grad():
        a = sequence_logprobs(model, rows, budget, 0, compute_dtype=dtype, attention="masked")
        b = sequence_logprobs(model, rows, budget, 0, compute_dtype=dtype, attention="causal")
    live = torch.arange(a.shape[1], device=a.device)[None] < torch.tensor(rows.lengths, device=a.device)[:, None]
    # each pass's share of a causal step: the no-grad pass, the loss, the micro-batched backward
    t0 = time.perf_counter()
    sequence_logprobs(model, rows, budget, 0, compute_dtype=dtype, attention="causal")
    t1 = time.perf_counter()
    for idx in micro_batches([len(s) for s in rows.sequences], budget):
        with precision(model, dtype):
            _forward(model, rows, idx, 0, 1.0, 1024, "causal").sum().backward()
    if gpu:
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    model.zero_grad(set_to_none=True)
    result = {"device": device, "parameters": params, "rows": len(rows), "tokens": tokens, "budget": budget,
              "dtype": str(dtype), **{f"{att}_seconds": t["median_s"] for att, t in timed.items()},
              "tokens_per_s_masked": tokens / timed["masked"]["median_s"],
              "tokens_per_s_causal": tokens / timed["causal"]["median_s"],
              "speedup_causal_over_masked": timed["masked"]["median_s"] / timed["causal"]["median_s"],
              "max_logprob_diff": float((a - b).abs()[live].max()),
              "share_no_grad_pass": (t1 - t0) / (t2 - t0), "share_forward_backward": (t2 - t1) / (t2 - t0)}
    if gpu:
        peak = matmul_tflops(device)
        result.update(matmul_tflops=peak, mfu_causal=6 * params * result["tokens_per_s_causal"] / 1e12 / peak,
                      mfu_masked=6 * params * result["tokens_per_s_masked"] / 1e12 / peak,
                      step_seconds_1024_rows_extrapolated=1024 / len(rows) * timed["causal"]["median_s"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    write_result("update", measure(args.gpu, args.micro_batches, args.rounds))


if __name__ == "__main__":
    main()
