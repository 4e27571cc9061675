"""The GPU half of the benchmarks (see bench/gpu.sh), in one run of under 8 minutes: every
estimator trained a few stale steps on CUDA (the device regression check); a random-init
Qwen3-4B shape built on the GPU (no weights travel): the update's peak at budgets 8,192 /
16,384 / 32,768, with and without a 28 GiB allocation standing in for vLLM, against the memory
plan (gmc.memory); the update's model-FLOPs utilisation, causal against masked attention
interleaved on the same rows (bench/update.py: a stated number of micro-batches timed and
extrapolated) with the largest log-prob difference between them; whether a row's log-probs are
identical alone, beside others and in a partial last micro-batch on CUDA; a profiler table of
the top kernels of one micro-batch; vLLM when it is installed. Memory in GiB.

Each part runs on its own: a part that fails records its error and the others still run, and
the JSON is rewritten after every part, so a run cut short keeps what it measured.
``GMC_GPU_CHECK_SMALL=1`` shrinks every shape so that the script can be checked on a CPU."""

import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results")
TOKENIZER = Path("results/models/tiny/seed~0")
SMALL = os.environ.get("GMC_GPU_CHECK_SMALL") == "1"
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None
result: dict = {"cuda": CUDA, "torch": torch.__version__, "small": SMALL,
                "gpu": torch.cuda.get_device_name() if CUDA else None, "bitsandbytes": HAS_BNB}


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def reset_peak() -> None:
    if CUDA:
        torch.cuda.reset_peak_memory_stats()


def peak_gb() -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if CUDA else None


def qwen3_4b():
    """Qwen3-4B's shape (36 layers, hidden 2,560, GQA 32/8, head 128, vocabulary 151,936) with random
    weights, built on the device in float32 (the masters), with gradient checkpointing."""
    from common import random_qwen3

    from gmc.memory import ModelShape

    shape = ModelShape(64, 128, 2, 4, 2, 16, 1000, True) if SMALL else ModelShape.of("Qwen/Qwen3-4B")
    return random_qwen3(shape, DEVICE, checkpointing=True), shape


def rows_for(budget: int, micro_batches: int, vocab: int):
    """Stale groups of 64 + 4,096-token rows (4,608 padded) filling ``micro_batches`` forwards."""
    from gmc.asynchrony import Group

    P, T = (8, 56) if SMALL else (64, 4096)
    per = max(1, budget // (64 if SMALL else 4608))
    n = per * micro_batches
    return [Group(prompt_index=0, prompt_ids=torch.randint(0, vocab, (P,)), response_ids=torch.randint(0, vocab, (n, T)),
                  response_mask=torch.ones(n, T, dtype=torch.bool), rewards=torch.arange(n).float() % 2,
                  behaviour_logp=torch.full((n, T), -11.0), sampler_logp=torch.zeros(n, T), version=0)]


def memory_4b() -> dict:
    """Peak of one update plus the optimizer step, steady state (the 8-bit states exist), per budget,
    with and without a 28 GiB allocation for vLLM, against the plan."""
    from gmc.config import load_train_config
    from gmc.estimators import EstimatorConfig, get_estimator
    from gmc.memory import GIB, plan
    from gmc.update import Update

    model, shape = qwen3_4b()
    opt = (__import__("bitsandbytes").optim.AdamW8bit if HAS_BNB else torch.optim.AdamW)(model.parameters(), lr=1e-6)
    for p in model.parameters():  # allocate the optimizer's states: the steady state of a run
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    out = {"parameters": sum(p.numel() for p in model.parameters()), "optimizer": type(opt).__name__}
    standin = 28 * GIB if not SMALL else 2**20
    for budget in (8192, 16384, 32768):
        for vllm in (False, True):
            block = torch.empty(standin, dtype=torch.uint8, device=DEVICE) if vllm else None
            update = Update(model, get_estimator("gmc"), EstimatorConfig(max_new_tokens=4096), budget, pad_id=0,
                            chunk_size=1024, compute_dtype=torch.bfloat16)
            sync()
            reset_peak()
            try:
                update.backward(rows_for(budget, 2, shape.vocab_size), on_policy=False)
                opt.step()
                sync()
                measured = peak_gb()
            except torch.OutOfMemoryError as e:
                measured = f"out of memory: {e}"[:200]
            opt.zero_grad(set_to_none=True)
            del block
            cfg = load_train_config(None, ["model=Qwen/Qwen3-4B", "model_dtype=bfloat16", "gradient_checkpointing=true",
                                           "optimizer=adamw8bit", f"micro_batch_tokens={budget}", "logprob_chunk_size=1024"])
            planned = plan(cfg, None).training / GIB + (standin / GIB if vllm else 0)
            out[f"budget_{budget}{'_vllm28' if vllm else ''}"] = {"peak_gib": measured, "plan_gib": planned}
    del model, opt
    torch.cuda.empty_cache() if CUDA else None
    return out


def mfu_4b() -> dict:
    """bench/update.py on the GPU: one pass against a no-grad pass first, causal against masked
    attention, forwards per token and model-FLOPs utilisation."""
    from update import measure  # bench/, the script's folder, is on the path

    return measure(gpu=CUDA and not SMALL, micro_batches_timed=2, rounds=3)


def logprob_identity() -> dict:
    """A row's log-probs alone, beside other rows, and in a partial last micro-batch, on CUDA in bf16."""
    from gmc.models import Qwen3Shape, qwen3_model
    from gmc.update import Rows, sequence_logprobs

    with torch.device(DEVICE):
        model = qwen3_model(Qwen3Shape(hidden_size=512, intermediate_size=1536, num_layers=4, num_heads=8,
                                       num_kv_heads=4), 4096).train()
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 4096, (int(n),), generator=gen) for n in torch.randint(200, 240, (7,), generator=gen)]
    rows = Rows(seqs, [16] * 7, [len(s) - 16 for s in seqs])
    kw = dict(pad_id=0, compute_dtype=torch.bfloat16)
    whole = sequence_logprobs(model, rows, 0, **kw)  # every row in one forward
    partial = sequence_logprobs(model, rows, 3 * 256, **kw)  # three per forward: the last holds one
    alone = [sequence_logprobs(model, Rows([s], [16], [len(s) - 16]), 0, **kw)[0] for s in seqs]
    same = lambda a, b, n: bool(torch.equal(a[:n], b[:n]))  # noqa: E731
    return {"alone_equals_beside": all(same(alone[i], whole[i], rows.lengths[i]) for i in range(7)),
            "partial_equals_whole": all(same(partial[i], whole[i], rows.lengths[i]) for i in range(7)),
            "max_diff_alone": max(float((alone[i][: rows.lengths[i]] - whole[i, : rows.lengths[i]]).abs().max())
                                  for i in range(7))}


def profile_micro_batch() -> dict:
    """The top CUDA kernels of one micro-batch forward/backward of the 4B shape (16,384 tokens)."""
    from torch.profiler import ProfilerActivity, profile

    from gmc.update import Rows, _forward, precision

    model, shape = qwen3_4b()
    (g,) = rows_for(16384, 1, shape.vocab_size)
    rows = Rows.from_groups([g])
    idx = list(range(len(rows)))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    with profile(activities=activities) as prof:
        with precision(model, torch.bfloat16):
            _forward(model, rows, idx, 0, 1.0, 1024).sum().backward()
        sync()
    key = "cuda_time_total" if CUDA else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=15)
    print(table)
    events = sorted(prof.key_averages(), key=lambda e: -getattr(e, "device_time_total" if CUDA else "cpu_time_total"))
    return {"top": [{"name": e.key[:80], "ms": getattr(e, "device_time_total" if CUDA else "cpu_time_total") / 1e3,
                     "calls": e.count} for e in events[:15]]}


def estimators() -> dict:
    """Three stale steps of every estimator on the tiny model, bfloat16 over float32 masters."""
    from gmc.config import load_train_config
    from gmc.estimator_info import REGISTRY
    from gmc.io import read_jsonl
    from gmc.trainer import Trainer

    out = {}
    optimizer = "adamw8bit" if HAS_BNB else "adamw"
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(REGISTRY):
            cfg = load_train_config(None, [f"model={TOKENIZER}", f"device={DEVICE}", "model_dtype=bfloat16",
                                           f"optimizer={optimizer}", "steps=3", "checkpoint_every=0", f"algorithm={name}",
                                           "delay.d=2", "gradient_checkpointing=true", "micro_batch_tokens=256"])
            reset_peak()
            Trainer(cfg, Path(tmp) / name, progress=False).run()
            rows = read_jsonl(Path(tmp) / name / "metrics.jsonl")
            out[name] = {"loss": [r["train/loss"] for r in rows], "step_seconds": [r["time/step_seconds"] for r in rows],
                         "peak_gpu_gb": peak_gb()}
    return out


def vllm_engine(model_dir: str, model) -> dict:
    from gmc.data import PLAIN_TEMPLATE
    from gmc.engines import SamplingConfig, VLLMConfig
    from gmc.rollout import VLLMEngine
    from gmc.synthetic import SyntheticTask

    engine = VLLMEngine(model_dir, cfg=VLLMConfig(gpu_memory_utilization=0.3, dtype="bfloat16"))
    prompts = [PLAIN_TEMPLATE.format(problem=r.problem) for r in SyntheticTask().generate("test", 64)]
    t = time.perf_counter()
    groups = engine.generate(prompts, 8, SamplingConfig(max_new_tokens=256))
    dt = time.perf_counter() - t
    tokens = sum(s.length for g in groups for s in g)
    t = time.perf_counter()
    engine.sync_weights(model.to(DEVICE))
    sync()
    return {"tokens": tokens, "tokens_per_s": tokens / dt, "weight_sync_s": time.perf_counter() - t}


def part(name: str, fn, *args) -> None:
    """Run one part, record its result or its error, and write everything measured so far."""
    print(f"== {name}", flush=True)
    t = time.perf_counter()
    try:
        result[name] = fn(*args)
    except Exception as exc:  # one part's failure must not lose the others' numbers
        traceback.print_exc()
        result[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(f"== {name}: {time.perf_counter() - t:.1f} s", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "gpu.json").write_text(json.dumps(result, indent=2))


def main() -> None:
    part("estimators", estimators)
    part("memory_4b", memory_4b)
    part("mfu_4b", mfu_4b)
    part("logprob_identity", logprob_identity)
    part("profile_micro_batch", profile_micro_batch)
    if importlib.util.find_spec("vllm"):
        with tempfile.TemporaryDirectory() as tmp:
            from transformers import AutoTokenizer

            from gmc.models import Qwen3Shape, qwen3_model

            model = qwen3_model(Qwen3Shape(hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
                                           num_kv_heads=8), 151936, head_dim=128).to(torch.bfloat16)
            model.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(TOKENIZER).save_pretrained(tmp)
            part("vllm", vllm_engine, tmp, model)
    else:
        result["vllm"] = "skipped: vllm is not installed"
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
