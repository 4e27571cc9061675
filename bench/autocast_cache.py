"""The no-grad log-prob pass over float32 masters in bfloat16 (the behaviour pass, which on a GPU
runs beside vLLM): autocast casting each weight where it is used (its cache off, what
``gmc.policy.logprobs.sequence_logprobs`` does) against casting every weight once and keeping the
copies for the pass (the cache on). Time in this process (interleaved), peak memory in a fresh
process per variant (ru_maxrss, minus a process that only builds the inputs); the log-probs
must be equal.

CPU: a random Qwen3 of hidden 512, 8 layers, vocabulary 32,768 (weights 4x the activations of
a micro-batch, as at 4B), 16 rows of 64 + 192 tokens, budget 1,024.
Run: python bench/autocast_cache.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import interleaved, peak_rss_mb, write_result  # noqa: E402

SETUP = """
import torch
from common import random_qwen3
from gmc.policy.memory import ModelShape
from gmc.policy.logprobs import Rows, _forward, precision
torch.manual_seed(0)
shape = ModelShape(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=64, vocab_size=32768, tie_word_embeddings=True)
model = random_qwen3(shape, "cpu")
seqs = [torch.randint(0, 32768, (256,)) for _ in range(16)]
rows = Rows(seqs, [64] * 16, [192] * 16)

def run(cache):
    out = []
    with torch.no_grad(), precision(model, torch.bfloat16, cache=cache):
        for idx in rows.plan(1024):
            out.append(_forward(model, rows, idx, 0, 1.0, 1024, "causal"))
    return out
"""


def main() -> None:
    bench = str(Path(__file__).resolve().parent)
    prefix = f"import sys; sys.path.insert(0, {bench!r})\n"
    base = peak_rss_mb(prefix + SETUP)
    mem = {cache: peak_rss_mb(prefix + SETUP + f"run({cache})") - base for cache in (False, True)}
    scope: dict = {}
    exec(prefix + SETUP, scope)
    equal = all(torch.equal(a, b) for a, b in zip(scope["run"](False), scope["run"](True)))
    timed = interleaved(
        {"cast_where_used": lambda: scope["run"](False), "cached": lambda: scope["run"](True)}, rounds=5
    )
    params = sum(p.numel() for p in scope["model"].parameters())
    write_result(
        "autocast_cache",
        {
            "parameters": params,
            "bfloat16_copy_mb": params * 2 / 2**20,
            "logprobs_equal": equal,
            "cast_where_used": {**timed["cast_where_used"], "peak_extra_mb": mem[False]},
            "cached": {**timed["cached"], "peak_extra_mb": mem[True]},
            "time_ratio_cast_where_used_over_cached": timed["cast_where_used"]["median_s"]
            / timed["cached"]["median_s"],
            "memory_saved_mb": mem[True] - mem[False],
        },
    )


if __name__ == "__main__":
    main()
