"""Response log-probs at Qwen3's vocabulary (151,936): chunked against naive log_softmax + gather.

Random hidden states and LM head on CPU, float32, forward and backward. Peak memory is measured
in a fresh process per variant (ru_maxrss, minus a process that only builds the inputs), time
in this process; results must agree.
Run: python bench/logprobs.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import interleaved, peak_rss_mb, write_result  # noqa: E402

from gmc.policy.model import token_logprobs_from_hidden  # noqa: E402

N, T, H, V = 8, 256, 256, 151_936
SETUP = f"""
import torch
from gmc.policy.model import token_logprobs_from_hidden
torch.manual_seed(0)
hidden = torch.empty({N}, {T}, {H}).normal_().requires_grad_(True)
weight = torch.empty({V}, {H}).normal_(0, 0.02).requires_grad_(True)  # in place: no temporary copy
targets = torch.randint(0, {V}, ({N}, {T}))
"""
NAIVE = (
    "lp = torch.log_softmax(hidden @ weight.T, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1); lp.sum().backward()"
)
CHUNK = 256
CHUNKED = f"lp = token_logprobs_from_hidden(weight, hidden, targets, chunk_size={CHUNK}); lp.sum().backward()"


def main() -> None:
    # memory first: a child's ru_maxrss starts from this process's peak (Linux keeps it across exec)
    base = peak_rss_mb(SETUP)
    mem_naive = peak_rss_mb(SETUP + NAIVE) - base
    mem_chunk = peak_rss_mb(SETUP + CHUNKED) - base
    print(f"peak RSS: inputs {base:.0f} MB, naive +{mem_naive:.0f} MB, chunked +{mem_chunk:.0f} MB")
    torch.manual_seed(0)
    hidden = torch.randn(N, T, H, requires_grad=True)
    weight = (torch.randn(V, H) * 0.02).requires_grad_(True)
    targets = torch.randint(0, V, (N, T))
    naive = torch.log_softmax(hidden @ weight.T, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    chunked = token_logprobs_from_hidden(weight, hidden, targets, chunk_size=CHUNK)
    max_diff = float((naive - chunked).detach().abs().max())

    def run(code):
        scope = {
            "torch": torch,
            "token_logprobs_from_hidden": token_logprobs_from_hidden,
            "hidden": hidden,
            "weight": weight,
            "targets": targets,
        }
        return lambda: exec(code, scope)

    timed = interleaved({"naive": run(NAIVE), "chunked": run(CHUNKED)}, rounds=3)
    t_naive, t_chunk = timed["naive"], timed["chunked"]
    write_result(
        "logprobs",
        {
            "shape": {"N": N, "T": T, "hidden": H, "vocab": V},
            "max_abs_diff": max_diff,
            "naive": {**t_naive, "peak_extra_mb": mem_naive},
            "chunked": {**t_chunk, "peak_extra_mb": mem_chunk, "chunk_size": CHUNK},
            "memory_ratio_naive_over_chunked": mem_naive / mem_chunk,
            "time_ratio_chunked_over_naive": t_chunk["median_s"] / t_naive["median_s"],
        },
    )


if __name__ == "__main__":
    main()
