"""The GPU half of the benchmarks, one part per process (``bench/gpu.sh`` runs each under its own
time limit, so a part that hangs, fails or breaks its CUDA context costs only itself), in the
order they run:

- ``setup``: the check's tiny model (``results/gpu_check/tiny``) built when missing;
- ``estimators``: every estimator trained a few stale steps on CUDA (the device regression check);
- ``memory_4b``: a random-init Qwen3-4B shape built on the GPU (no weights travel): the update's
  peak (the allocator's reservation plus the CUDA context) at budgets 8,192 / 16,384 / 32,768,
  with and without a 28 GiB allocation standing in for vLLM, against the memory plan
  (gmc.policy.memory) at the micro-batches' real padded tokens;
- ``mfu_0.6b``, ``mfu_4b``: bench/update.py at each shape: one pass against a no-grad pass
  first (at 0.6B also causal against masked attention), the forwards per token, and the
  model-FLOPs utilisation against the chip's dense bf16 peak, as useful work (6N plus
  attention per token) and as the work done (the no-grad pass and the recompute included);
  one timed round at 4B;
- ``vllm_cycle``: a training run on vLLM (eager) with sleep mode, the device's used memory at
  every hand-over (after generation, after the behaviour pass, asleep, after the reload) and
  its sampled peak, against the plan;
- ``resume_cuda``: a CUDA run stopped after two steps and resumed, against the same run
  uninterrupted (every metric but wall-clock ones);
- ``logprob_identity``: a row's log-probs alone, beside others and in a partial last
  micro-batch on CUDA;
- ``profile_micro_batch``: the top CUDA kernels of one 4B micro-batch.

Memory in GiB. ``python bench/gpu_check.py OUT PART`` writes ``OUT/gpu.PART.json``, again after
every measurement (a part stopped at its time limit keeps what it measured; ``finished`` says
whether it ran to its end; ``bench/gpu.sh`` writes a part it skips as ``skipped``); ``--merge``
gathers them into ``OUT/gpu.json``; ``--parts`` lists each part and its time limit.
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
TOKENIZER = Path("results/gpu_check/tiny")  # the check's own tiny model, apart from any sweep's
SMALL = os.environ.get("GMC_GPU_CHECK_SMALL") == "1"
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None
OPTIMIZER = "adamw8bit" if HAS_BNB and CUDA else "adamw"
GIB = 2**30
LIMIT_SCALE = 3 if SMALL else 1
"""The small shapes on a CPU take longer than the real ones on a GPU: their limits (and the
window of ``bench/gpu.sh``) are three times as long."""


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def reset_peak() -> None:
    if CUDA:
        torch.cuda.reset_peak_memory_stats()


def peak_gb() -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if CUDA else None


class Record(dict):
    """A part's measurements, written to ``OUT/gpu.PART.json`` (atomically) each time one is set."""

    def __init__(self, part: str):
        super().__init__(finished=False)
        self.path = OUT / f"gpu.{part}.json"
        self._write()

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self._write()

    def update(self, *args, **kwargs) -> None:
        super().update(*args, **kwargs)
        self._write()

    def _write(self) -> None:
        from gmc.io import write_json

        write_json(self.path, dict(self))


def qwen3_4b():
    """Qwen3-4B's shape (36 layers, hidden 2,560, GQA 32/8, head 128, vocabulary 151,936) with random
    weights, built on the device in float32 (the masters), with gradient checkpointing."""
    from common import random_qwen3

    from gmc.policy.memory import ModelShape

    shape = ModelShape(64, 128, 2, 4, 2, 16, 1000, True) if SMALL else ModelShape.of("Qwen/Qwen3-4B")
    return random_qwen3(shape, DEVICE, checkpointing=True), shape


def rows_for(budget: int, micro_batches: int, vocab: int):
    """Stale groups of 64 + 4,096-token rows (4,224 padded) filling ``micro_batches`` forwards."""
    from gmc.policy.logprobs import canonical_length
    from gmc.rollouts.groups import Group

    P, T = (8, 56) if SMALL else (64, 4096)
    per = max(1, budget // canonical_length(P + T))
    n = per * micro_batches
    return [
        Group(
            prompt_index=0,
            prompt_ids=torch.randint(0, vocab, (P,)),
            response_ids=torch.randint(0, vocab, (n, T)),
            response_mask=torch.ones(n, T, dtype=torch.bool),
            rewards=torch.arange(n).float() % 2,
            behaviour_logp=torch.full((n, T), -11.0),
            sampler_logp=torch.zeros(n, T),
            version=0,
        )
    ]


def memory_4b(rec: Record) -> None:
    """Peak of one update plus the optimizer step, steady state (the 8-bit states exist), per budget,
    with and without a 28 GiB allocation for vLLM, against the plan. Measured: the allocator's
    peak reservation (``max_memory_reserved``, its cached blocks included) plus the CUDA context
    (the device's used memory before the part allocated anything), as the plan counts them;
    planned: at the micro-batches' real padded tokens (whole 4,224-token rows) and at the budget."""
    from gmc.estimators import REGISTRY, EstimatorConfig, get_estimator
    from gmc.policy.logprobs import Rows, padded_tokens
    from gmc.policy.memory import plan
    from gmc.policy.update import Update
    from gmc.run.config import load_train_config

    context = (torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0]) / GIB if CUDA else 0.0
    model, shape = qwen3_4b()
    opt = (__import__("bitsandbytes").optim.AdamW8bit if HAS_BNB else torch.optim.AdamW)(model.parameters(), lr=1e-6)
    for p in model.parameters():  # allocate the optimizer's states: the steady state of a run
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    rec.update(parameters=sum(p.numel() for p in model.parameters()), optimizer=type(opt).__name__, context_gib=context)
    standin = 28 * GIB if not SMALL else 2**20

    def planned(tokens: int) -> float:
        cfg = load_train_config(
            None,
            [
                "model=Qwen/Qwen3-4B",
                "model_dtype=bfloat16",
                "gradient_checkpointing=true",
                "optimizer=adamw8bit",
                f"micro_batch_tokens={tokens}",
                "logprob_chunk_size=1024",
            ],
        )
        return plan(cfg, None, shape).training / GIB

    for budget in (8192, 16384, 32768):
        for vllm in (False, True):
            if CUDA:  # the reservation measured is this update's, not the cache of the one before
                torch.cuda.empty_cache()
            block = torch.empty(standin, dtype=torch.uint8, device=DEVICE) if vllm else None
            update = Update(
                model,
                get_estimator("gmc"),
                REGISTRY["gmc"].resolved(EstimatorConfig()),
                budget,
                pad_id=0,
                chunk_size=1024,
                compute_dtype=torch.bfloat16,
                max_new_tokens=4096,
            )
            rows = rows_for(budget, 2, shape.vocab_size)
            padded = max(padded_tokens(Rows.from_groups(rows), budget))  # the largest micro-batch's
            sync()
            reset_peak()
            try:
                update.backward(rows, on_policy=False)
                opt.step()
                sync()
                measured = {
                    "peak_allocated_gib": peak_gb(),
                    "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB if CUDA else None,
                }
                if CUDA:
                    measured["measured_gib"] = measured["peak_reserved_gib"] + context
            except torch.OutOfMemoryError as e:
                measured = {"error": f"out of memory: {e}"[:200]}
            opt.zero_grad(set_to_none=True)
            del block
            extra = standin / GIB if vllm else 0
            rec[f"budget_{budget}{'_vllm28' if vllm else ''}"] = {
                **measured,
                "micro_batch_padded_tokens": padded,
                "plan_gib": planned(padded) + extra,
                "plan_at_budget_gib": planned(budget) + extra,
            }
    del model, opt
    torch.cuda.empty_cache() if CUDA else None


def mfu(rec: Record, model: str, rounds: int, attention: bool) -> None:
    """bench/update.py on the GPU for the shape of ``model``: one pass against a no-grad pass
    first (and, with ``attention``, causal against masked attention), the work per token and the
    model-FLOPs utilisation against the chip's peak, each written as it is measured."""
    from update import measure  # bench/, the script's folder, is on the path

    measure(
        gpu=CUDA and not SMALL,
        micro_batches_timed=2,
        rounds=1 if SMALL else rounds,
        model=model,
        attention_variants=attention,
        out=rec,
    )


def logprob_identity(rec: Record) -> None:
    """A row's log-probs alone, beside other rows, and in a partial last micro-batch, on CUDA in bf16."""
    from gmc.policy.build import Qwen3Shape, qwen3_model
    from gmc.policy.logprobs import Rows, sequence_logprobs

    with torch.device(DEVICE):
        model = qwen3_model(
            Qwen3Shape(hidden_size=512, intermediate_size=1536, num_layers=4, num_heads=8, num_kv_heads=4), 4096
        ).train()
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 4096, (int(n),), generator=gen) for n in torch.randint(200, 240, (7,), generator=gen)]
    rows = Rows(seqs, [16] * 7, [len(s) - 16 for s in seqs])
    kw = dict(pad_id=0, compute_dtype=torch.bfloat16)
    whole = sequence_logprobs(model, rows, 0, **kw)  # every row in one forward
    partial = sequence_logprobs(model, rows, 3 * 256, **kw)  # three per forward: the last holds one
    alone = [sequence_logprobs(model, Rows([s], [16], [len(s) - 16]), 0, **kw)[0] for s in seqs]
    same = lambda a, b, n: bool(torch.equal(a[:n], b[:n]))  # noqa: E731
    rec.update(
        {
            "alone_equals_beside": all(same(alone[i], whole[i], rows.lengths[i]) for i in range(7)),
            "partial_equals_whole": all(same(partial[i], whole[i], rows.lengths[i]) for i in range(7)),
            "max_diff_alone": max(
                float((alone[i][: rows.lengths[i]] - whole[i, : rows.lengths[i]]).abs().max()) for i in range(7)
            ),
        }
    )


def profile_micro_batch(rec: Record) -> None:
    """The top CUDA kernels of one micro-batch forward/backward of the 4B shape (16,384 tokens)."""
    from torch.profiler import ProfilerActivity, profile

    from gmc.policy.logprobs import Rows, _forward, precision

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
    rec["top"] = [
        {
            "name": e.key[:80],
            "ms": getattr(e, "device_time_total" if CUDA else "cpu_time_total") / 1e3,
            "calls": e.count,
        }
        for e in events[:15]
    ]


def estimators(rec: Record) -> None:
    """Three stale steps of every estimator on the tiny model, bfloat16 over float32 masters."""
    from gmc.estimators import REGISTRY
    from gmc.io import read_jsonl
    from gmc.run.config import load_train_config
    from gmc.run.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(REGISTRY):
            cfg = load_train_config(
                None,
                [
                    f"model={TOKENIZER}",
                    f"device={DEVICE}",
                    "model_dtype=bfloat16",
                    f"optimizer={OPTIMIZER}",
                    "steps=3",
                    "checkpoint_every=0",
                    f"algorithm={name}",
                    "delay.d=2",
                    "gradient_checkpointing=true",
                    "micro_batch_tokens=256",
                ],
            )
            reset_peak()
            Trainer(cfg, Path(tmp) / name, progress=False).run()
            rows = read_jsonl(Path(tmp) / name / "metrics.jsonl")
            rec[name] = {
                "loss": [r["train/loss"] for r in rows],
                "step_seconds": [r["time/step_seconds"] for r in rows],
                "peak_gpu_gb": peak_gb(),
            }


def setup(rec: Record) -> None:
    """The tiny model the other parts read (its tokenizer, the estimators' runs), built when missing."""
    from gmc.run.tiny_model import TinyModelConfig, build_tiny_model

    if (TOKENIZER / "config.json").exists():
        rec.update(tiny_model=str(TOKENIZER), built=False)
        return
    summary = build_tiny_model(TOKENIZER, TinyModelConfig(max_steps=100, eval_every=100), progress=False)
    rec.update(tiny_model=str(TOKENIZER), built=True, seconds=summary["seconds"])


def _small_run(out: Path, *overrides: str):
    from gmc.run.config import load_train_config

    return load_train_config(
        None,
        [
            f"model={TOKENIZER}",
            f"device={DEVICE}",
            "model_dtype=bfloat16",
            f"optimizer={OPTIMIZER}",
            "delay.d=2",
            "micro_batch_tokens=256",
            "checkpoint_every=2",
            *overrides,
        ],
    )


def resume_cuda(rec: Record) -> None:
    """A four-step CUDA run at delay 2 (checkpoints at steps 2 and 4, both kept), then a copy of
    it resumed by a new trainer from the checkpoint of step 2 (queued groups, random states,
    8-bit optimizer states), against the uninterrupted run: the metrics (wall clock aside) and
    the final weights."""
    import os
    import shutil

    from gmc.io import read_jsonl
    from gmc.run.summary import without_time
    from gmc.run.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        straight, resumed = Path(tmp) / "straight", Path(tmp) / "resumed"
        cfg = _small_run(straight, "steps=4", "keep_checkpoints=all")
        Trainer(cfg, straight, progress=False).run()
        shutil.copytree(straight, resumed)
        (resumed / "summary.json").unlink()
        os.replace(resumed / "checkpoint.prev.pt", resumed / "checkpoint.pt")
        trainer = Trainer(cfg, resumed, resume=True, progress=False)
        at = trainer.step
        trainer.run()
        a, b = without_time(read_jsonl(straight / "metrics.jsonl")), without_time(read_jsonl(resumed / "metrics.jsonl"))
        differing = sorted({k for x, y in zip(a, b) for k in x if x[k] != y.get(k)})
        wa = torch.load(straight / "checkpoint.pt", weights_only=False)["model"]
        wb = torch.load(resumed / "checkpoint.pt", weights_only=False)["model"]
        rec.update(
            {
                "resumed_at_step": at,
                "steps": len(b),
                "metrics_equal": a == b,
                "differing_metrics": differing,
                "weights_equal": all(torch.equal(wa[k], wb[k]) for k in wa),
            }
        )


def vllm_cycle(rec: Record) -> None:
    """Three stale steps of a run on vLLM with sleep mode (a random Qwen3-0.6B shape, bfloat16
    over float32 masters, vLLM eager: no CUDA-graph capture in the window): the device's used
    memory (total - free: vLLM's and PyTorch's) at every hand-over, the trainer's behaviour pass
    included (it runs while vLLM is awake), and its peak sampled every 20 ms, against the plan's
    phases."""
    if importlib.util.find_spec("vllm") is None:
        rec["skipped"] = "vllm is not installed"
        return
    import threading

    from transformers import AutoTokenizer

    from gmc.policy.build import Qwen3Shape, qwen3_model
    from gmc.policy.memory import plan
    from gmc.policy.update import Update
    from gmc.run.trainer import Trainer

    def used() -> float:
        free, total = torch.cuda.mem_get_info()
        return (total - free) / GIB

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        shape = Qwen3Shape(hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16, num_kv_heads=8)
        qwen3_model(shape, 151936, head_dim=128).to(torch.bfloat16).save_pretrained(folder)
        AutoTokenizer.from_pretrained(TOKENIZER).save_pretrained(folder)
        cfg = _small_run(
            Path(tmp) / "run",
            f"model={folder}",
            "engine=vllm",
            "vllm.sleep=true",
            "vllm.enforce_eager=true",
            "vllm.gpu_memory_utilization=0.3",
            "steps=3",
            "micro_batch_tokens=4096",
            "sampling.max_new_tokens=256",
            "gradient_checkpointing=auto",
        )
        rec["used_before_gib"] = round(used(), 2)
        marks: list = []

        def mark(name, fn):
            def wrapped(*args, **kwargs):
                out = fn(*args, **kwargs)
                marks.append((name, round(used(), 2)))
                rec["marks"] = marks
                return out

            return wrapped

        Update.logprobs = mark("after the behaviour pass", Update.logprobs)  # before the trainer binds it
        trainer = Trainer(cfg, Path(tmp) / "run", progress=False)
        engine = trainer.engine
        engine.generate = mark("after generation", engine.generate)
        engine.release_memory = mark("asleep", engine.release_memory)
        engine.sync_weights = mark("after the reload", engine.sync_weights)
        peak, done = [0.0], threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], used())
                done.wait(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        t = time.perf_counter()
        try:
            trainer.run()
        finally:
            done.set()
            watcher.join()
        p = plan(cfg, trainer.memory_plan.limit if trainer.memory_plan else None)
        rec.update(
            {
                "seconds": time.perf_counter() - t,
                "peak_allocated_gib": peak_gb(),
                "plan_gib": {k: round(p.total(k) / GIB, 2) for k in ("training", "generation", "resume")},
                "peak_at_marks_gib": max(u for _, u in marks),
                "peak_sampled_gib": round(peak[0], 2),
            }
        )


PARTS = {  # what a lent GPU must answer first comes first: a part that no longer fits the window is skipped
    "setup": (setup, 45),
    "estimators": (estimators, 45),
    "memory_4b": (memory_4b, 75),
    "mfu_0.6b": (lambda rec: mfu(rec, "Qwen/Qwen3-0.6B", rounds=3, attention=True), 40),
    "mfu_4b": (lambda rec: mfu(rec, "Qwen/Qwen3-4B", rounds=1, attention=False), 75),
    "vllm_cycle": (vllm_cycle, 100),
    "resume_cuda": (resume_cuda, 30),
    "logprob_identity": (logprob_identity, 15),
    "profile_micro_batch": (profile_micro_batch, 25),
}
"""Each part and its time limit in seconds: 450 in all, which with the processes' start-ups
(about 6 s each) leaves the ten-minute window 90 s to spare (``bench/gpu.sh`` skips a part that
would not)."""


def main() -> None:
    arg = sys.argv[2] if len(sys.argv) > 2 else "--parts"
    if arg == "--parts":
        print("\n".join(f"{name} {limit * LIMIT_SCALE}" for name, (_, limit) in PARTS.items()))
        return
    if arg == "--merge":
        merged = {
            "cuda": CUDA,
            "torch": torch.__version__,
            "small": SMALL,
            "bitsandbytes": HAS_BNB,
            "gpu": torch.cuda.get_device_name() if CUDA else None,
        }
        for name in PARTS:
            path = OUT / f"gpu.{name}.json"
            merged[name] = json.loads(path.read_text()) if path.exists() else {"error": "no result: it never started"}
        from gmc.io import write_json

        write_json(OUT / "gpu.json", merged)
        print(json.dumps(merged, indent=2))
        return
    fn, _ = PARTS[arg]
    OUT.mkdir(parents=True, exist_ok=True)
    rec = Record(arg)
    t = time.perf_counter()
    try:
        fn(rec)
        rec["finished"] = True
    except Exception as exc:  # recorded, so the merge tells a failure from a time-out
        traceback.print_exc()
        rec["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    rec["part_seconds"] = round(time.perf_counter() - t, 1)
    print(json.dumps(rec, indent=2, default=str), flush=True)


if __name__ == "__main__":
    main()
