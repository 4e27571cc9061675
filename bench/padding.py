"""Padding of the update's canonical micro-batches at the paper's shape: 1,024 rows of a 64-token
prompt and a response of up to 4,096 tokens, budget 16,384, two length distributions (uniform
with 30% of the answers cut at the limit; log-normal), under gmc's canonical lengths (multiples
of a thirty-second to a sixty-fourth of a row, :func:`gmc.policy.logprobs.canonical_length`)
against a grid of eighths (multiples of an eighth to a sixteenth). Per grid: the padded tokens
over the real ones, the forwards of one pass, and the distinct lengths (buckets).

Run: python bench/padding.py
"""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from gmc.policy.logprobs import canonical_length  # noqa: E402

ROWS, PROMPT, LIMIT, BUDGET = 1024, 64, 4096, 16384


def eighths(n: int) -> int:
    """The alternative grid: ``n`` rounded up to a multiple of ``max(8, 2**floor(log2 n) / 8)``."""
    quantum = max(8, 1 << max(0, n.bit_length() - 4))
    return -(-n // quantum) * quantum


def measure(lengths: list[int], grid) -> dict:
    buckets: dict[int, int] = {}
    for n in lengths:
        buckets[grid(n)] = buckets.get(grid(n), 0) + 1
    padded = sum(width * count for width, count in buckets.items())
    forwards = sum(-(-count // max(1, BUDGET // width)) for width, count in buckets.items())
    return {"padding": padded / sum(lengths) - 1, "forwards": forwards, "buckets": len(buckets)}


def main() -> None:
    rng = random.Random(0)
    draws = {
        "uniform_30pct_at_limit": lambda: LIMIT if rng.random() < 0.3 else rng.randint(200, LIMIT),
        "lognormal": lambda: min(LIMIT, int(rng.lognormvariate(7.0, 0.7))),
    }
    out = {}
    for name, draw in draws.items():
        lengths = [PROMPT + draw() for _ in range(ROWS)]
        ours, alternative = measure(lengths, canonical_length), measure(lengths, eighths)
        out[name] = {
            "canonical": ours,
            "eighths": alternative,
            "padded_tokens_ratio": (1 + ours["padding"]) / (1 + alternative["padding"]),
            "forwards_ratio": ours["forwards"] / alternative["forwards"],
        }
    write_result("padding", out)


if __name__ == "__main__":
    main()
