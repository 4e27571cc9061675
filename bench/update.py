"""One update (gmc.policy.update.Update.backward) two ways on the same rows, interleaved:

- the work per token: a loss that needs no statistics of the batch (grpo) back-propagated
  micro-batch by micro-batch in one forward (``per_row``, what the trainer runs for it) against
  the same step with a no-grad pass over every row first (what a loss with batch statistics,
  such as gmc's group mass, needs); the forwards per token each path runs (layer calls counted by
  a hook: the no-grad pass, the training forward and, under checkpointing, its recompute; a
  backward counts as two), and their times;
- ``attention: causal`` (right-padded rows, no mask: SDPA's causal kernels) against
  ``attention: masked`` (the explicit padding mask), gmc's step, and the largest log-prob
  difference between them;

and, on a GPU, the model-FLOPs utilisation of each against the chip's dense bf16 peak from its
spec sheet (:data:`SPEC_BF16_TFLOPS`; the 8192^3 matmul rate measured in the same run is
reported beside it), two ways: *useful* work, ``6 N`` per token for the ``N`` parameters that
multiply (an untied input embedding is a lookup) plus attention's ``12 x layers x heads x
head_dim x context / 2`` (causal), the work one forward and one backward must do; and work
*done*, the forwards each path actually runs (a no-grad pass, the recompute under
checkpointing) plus the backward, over the padded tokens.

CPU (default): a random Qwen3 of hidden 256, 4 layers, vocabulary 4,096, 16 stale rows of
300-1,000 tokens, budget 4,096, float32. GPU (``--gpu``): a random Qwen3-4B shape in bfloat16
over float32 masters with checkpointing (``--model`` another Qwen3 the plan knows), budget 16,384,
rows of 4,160 tokens (4,224 padded); ``--micro-batches N`` times N micro-batches of the backward and
extrapolates to the 1,024-row step.

    python bench/update.py [--gpu] [--model Qwen/Qwen3-0.6B] [--micro-batches 4]
"""

from __future__ import annotations

import argparse
import time

import torch
from common import interleaved, random_qwen3, write_result

from gmc.estimators import REGISTRY, EstimatorConfig, get_estimator
from gmc.policy.logprobs import Rows, canonical_length, padded_tokens, sequence_logprobs
from gmc.policy.memory import ModelShape
from gmc.policy.update import Update
from gmc.rollouts.groups import Group


def groups(vocab: int, B: int, G: int, lengths, prompt: int, seed: int = 0) -> list[Group]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for b in range(B):
        n = lengths[b]
        out.append(
            Group(
                prompt_index=b,
                prompt_ids=torch.randint(0, vocab, (prompt,), generator=gen),
                response_ids=torch.randint(0, vocab, (G, max(n)), generator=gen),
                response_mask=torch.arange(max(n))[None] < torch.tensor(n)[:, None],
                rewards=(torch.arange(G) % 2).float(),
                behaviour_logp=-torch.rand(G, max(n), generator=gen) * 5,
                sampler_logp=torch.zeros(G, max(n)),
                version=0,
            )
        )
    return out


SPEC_BF16_TFLOPS = {
    "H200": 989.4,
    "H100 80GB HBM3": 989.4,
    "H100 SXM": 989.4,
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "A100": 312.0,
}
"""Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's spec sheets, by a part of the device name."""


def spec_tflops(name: str) -> float | None:
    return next((peak for key, peak in SPEC_BF16_TFLOPS.items() if key in name), None)


def attention_forward_flops(shape, lengths) -> float:
    """FLOPs of the attention scores and their weighted sum in one forward over rows of
    ``lengths`` tokens, causal: ``4 x layers x heads x head_dim`` per (query, key) pair, ``L (L + 1) / 2``
    pairs a row."""
    width = shape.num_hidden_layers * shape.num_attention_heads * shape.head_dim
    return 4.0 * width * sum(n * (n + 1) / 2 for n in lengths)


def matmul_parameters(model, shape) -> int:
    """Parameters that multiply: all but an untied input embedding (a lookup)."""
    params = sum(p.numel() for p in model.parameters())
    return params if shape.tie_word_embeddings else params - model.get_input_embeddings().weight.numel()


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


def forwards_per_token(model, run) -> dict[str, float]:
    """Layer-0 tokens forwarded while ``run()`` runs, per token of the batch's plan: without
    gradient (a no-grad pass) and with it (the training forward, and its recompute under
    checkpointing); ``work``: forwards plus two per backward, in forward-equivalents."""
    seen = {False: 0, True: 0}

    def count(_module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        seen[torch.is_grad_enabled()] += hidden.shape[0] * hidden.shape[1]

    hook = model.get_decoder().layers[0].register_forward_pre_hook(count, with_kwargs=True)
    try:
        run()
    finally:
        hook.remove()
    return {"no_grad": seen[False], "grad": seen[True]}


def measure(
    gpu: bool = False,
    micro_batches_timed: int = 4,
    rounds: int = 5,
    model: str = "Qwen/Qwen3-4B",
    attention_variants: bool = True,
    out: dict | None = None,
) -> dict:
    """The comparisons of the module docstring (on a GPU for the shape of ``model``; without
    ``attention_variants``, not causal against masked); returns what ``main`` writes, filled into
    ``out`` as it is measured (the GPU check's record, written at every entry)."""
    result = {} if out is None else out
    torch.manual_seed(0)
    if gpu:
        shape = ModelShape.of(model)
        dtype, budget, device = torch.bfloat16, 16384, "cuda"
        per = budget // canonical_length(64 + 4096)  # three rows of 64 + 4,096 tokens per micro-batch
        batch = groups(shape.vocab_size, 1, per * micro_batches_timed, [[4096] * (per * micro_batches_timed)], 64)
    else:
        shape = ModelShape(
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            vocab_size=4096,
            tie_word_embeddings=True,
        )
        dtype, budget, device = None, 4096, "cpu"
        lengths = torch.randint(250, 950, (4, 4), generator=torch.Generator().manual_seed(1)).tolist()
        batch = groups(shape.vocab_size, 4, 4, lengths, 50)
    model = random_qwen3(shape, device, checkpointing=gpu)
    params = sum(p.numel() for p in model.parameters())
    rows = Rows.from_groups(batch)
    tokens = sum(len(s) for s in rows.sequences)
    padded = sum(padded_tokens(rows, budget))
    cfg = EstimatorConfig()

    def update(name, **kw):
        return Update(
            model,
            get_estimator(name),
            REGISTRY[name].resolved(cfg),
            budget,
            pad_id=0,
            chunk_size=1024,
            compute_dtype=dtype,
            max_new_tokens=1024,
            **kw,
        )

    updates = {"one_pass": update("grpo", per_row=True), "no_grad_pass_first": update("grpo", per_row=False)}
    if attention_variants:
        updates |= {"causal": update("gmc", attention="causal"), "masked": update("gmc", attention="masked")}
    result.update(
        device=device,
        parameters=params,
        rows=len(rows),
        tokens=tokens,
        padded_tokens=padded,
        budget=budget,
        dtype=str(dtype),
        checkpointing=gpu,
    )

    def step(name):
        def run():
            updates[name].backward(batch, on_policy=False)
            model.zero_grad(set_to_none=True)
            if gpu:
                torch.cuda.synchronize()

        return run

    work = {}
    for name in ("one_pass", "no_grad_pass_first"):
        seen = forwards_per_token(model, step(name))
        forwards = (seen["no_grad"] + seen["grad"]) / padded
        work[name] = {"forwards_per_token": forwards, "backwards_per_token": 1.0, "work_per_token": forwards + 2.0}
    result["work_per_token"] = work
    timed = interleaved({name: step(name) for name in updates}, rounds=rounds)
    result.update({f"{name}_seconds": t["median_s"] for name, t in timed.items()})
    result.update({f"tokens_per_s_{name}": tokens / t["median_s"] for name, t in timed.items()})
    result["speedup_one_pass"] = timed["no_grad_pass_first"]["median_s"] / timed["one_pass"]["median_s"]
    if attention_variants:
        with torch.no_grad():
            a = sequence_logprobs(model, rows, budget, 0, compute_dtype=dtype, attention="masked")
            b = sequence_logprobs(model, rows, budget, 0, compute_dtype=dtype, attention="causal")
        live = torch.arange(a.shape[1], device=a.device)[None] < torch.tensor(rows.lengths, device=a.device)[:, None]
        result.update(
            speedup_causal_over_masked=timed["masked"]["median_s"] / timed["causal"]["median_s"],
            max_logprob_diff=float((a - b).abs()[live].max()),
        )
    n_matmul = matmul_parameters(model, shape)
    attention = attention_forward_flops(shape, [len(q) for q in rows.sequences])
    useful = 3 * (2 * n_matmul * tokens + attention)  # one forward and its backward (twice a forward)
    result.update(
        matmul_parameters=n_matmul,
        attention_share_of_useful=3 * attention / useful,
        useful_flops_per_token=useful / tokens,
        # the padded micro-batches' own attention is close to the rows' (whole rows, right padding)
        done_flops_per_token={
            name: w["work_per_token"] * (2 * n_matmul * padded + attention) / tokens for name, w in work.items()
        },
    )
    if gpu:
        name = torch.cuda.get_device_name()
        peak = spec_tflops(name)
        result.update(gpu=name, spec_bf16_tflops=peak, matmul_tflops=matmul_tflops(device))
        for variant, t in timed.items():
            if peak:
                result[f"mfu_useful_{variant}"] = useful / t["median_s"] / 1e12 / peak
                if variant in work:
                    result[f"mfu_done_{variant}"] = (
                        result["done_flops_per_token"][variant] * tokens / t["median_s"] / 1e12 / peak
                    )
        result["step_seconds_1024_rows_extrapolated"] = {v: 1024 / len(rows) * timed[v]["median_s"] for v in work}
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="Qwen/Qwen3-4B")
    args = parser.parse_args()
    write_result("update", measure(args.gpu, args.micro_batches, args.rounds, args.model))


if __name__ == "__main__":
    main()
