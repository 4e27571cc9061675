"""Peak memory of one training step as the batch grows 8x, with a token budget
(``micro_batch_tokens``) against without (the whole batch in one pass).

A Qwen3-architecture model at a realistic width for its vocabulary (151,936 entries, hidden
512, 2 layers, tied embeddings; random init, built locally) takes one ``gmc.policy.update.Update``
step (gmc estimator, stale groups, gradient checkpointing) on B x G rows of 16 prompt + 64
response tokens, B x G from 4 to 32. Each measurement runs in a fresh process; the number
reported is the growth of the peak resident memory during the step over the peak after a
one-row warm-up step (which holds the weights, their gradients and the allocator's pools).

    python bench/memory.py [budget=320]
"""

from __future__ import annotations

import subprocess
import sys

from common import write_result

ROWS = (4, 8, 16, 32)
PROMPT, RESPONSE = 16, 64

STEP = """
import resource, torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from gmc.rollouts.groups import Group
from gmc.estimators import REGISTRY, EstimatorConfig, get_estimator
from gmc.policy.update import Update
torch.manual_seed(0)
torch.set_num_threads(2)
cfg = Qwen3Config(vocab_size=151936, hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True)
model = Qwen3ForCausalLM(cfg)
model.gradient_checkpointing_enable()
model.config.use_cache = False

def groups(rows, G=4):
    g = torch.Generator().manual_seed(rows)
    out = []
    for b in range(max(1, rows // G)):
        n = min(G, rows)
        out.append(Group(prompt_index=b, prompt_ids=torch.randint(0, 151936, ({prompt},), generator=g),
                         response_ids=torch.randint(0, 151936, (n, {response}), generator=g),
                         response_mask=torch.ones(n, {response}, dtype=torch.bool),
                         rewards=torch.arange(n).float(), behaviour_logp=torch.full((n, {response}), -12.0),
                         sampler_logp=torch.zeros(n, {response}), version=0))
    return out

def step(rows):
    update = Update(model, get_estimator("gmc"), REGISTRY["gmc"].resolved(EstimatorConfig()), {budget}, pad_id=0,
                    chunk_size=1024, max_new_tokens={response})
    update.backward(groups(rows, min(4, rows)), on_policy=False)

step(2)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
step({rows})
print("STEP", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


def measure(rows: int, budget: int) -> float:
    code = STEP.format(prompt=PROMPT, response=RESPONSE, budget=budget, rows=rows)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("STEP")))


def main() -> None:
    budget = int(sys.argv[1]) if len(sys.argv) > 1 else 320
    table = []
    for rows in ROWS:
        table.append(
            {
                "rows": rows,
                "tokens": rows * (PROMPT + RESPONSE),
                "budget_mb": measure(rows, budget),
                "whole_batch_mb": measure(rows, 0),
            }
        )
        print(table[-1], flush=True)
    first = table[0]
    for r in table:
        r["budget_growth"] = r["budget_mb"] / first["budget_mb"]
        r["whole_batch_growth"] = r["whole_batch_mb"] / first["whole_batch_mb"]
    write_result(
        "memory",
        {
            "budget_tokens": budget,
            "vocab": 151936,
            "hidden": 512,
            "layers": 2,
            "prompt": PROMPT,
            "response": RESPONSE,
            "steps": table,
        },
    )


if __name__ == "__main__":
    main()
