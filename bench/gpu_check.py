"""The GPU half of the benchmarks (see bench/gpu.sh): every estimator trained a few stale steps
on CUDA with the tiny model in bfloat16 over float32 masters (the device regression check);
one update at the paper's batch shape (32 x 32 rows of 4,160 tokens, ``micro_batch_tokens``
16,384, checkpointing, 8-bit AdamW) on a random-init Qwen3-0.6B-sized model (peak memory, step
time); the HF engine's lean Qwen3 decoder against the model's own forward (agreement and
tokens/s in bfloat16); five training steps of that model with 8-bit AdamW; vLLM rollouts +
weight sync.

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
TOKENIZER = Path("results/models/tiny")
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


def qwen3_0_6b(vocab: int):
    """Qwen3-0.6B's shape (28 layers, hidden 1,024, GQA 16/8) with random weights, in bfloat16."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    layers, hidden = (2, 64) if SMALL else (28, 1024)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=hidden // 8, max_position_embeddings=4608,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).to(torch.bfloat16)


def estimators() -> dict:
    """Three stale steps of every estimator on the tiny model, bfloat16 over float32 masters."""
    from gmc.config import load_train_config
    from gmc.estimators import ESTIMATORS
    from gmc.io import read_jsonl
    from gmc.trainer import Trainer

    out = {}
    optimizer = "adamw8bit" if HAS_BNB else "adamw"
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(ESTIMATORS):
            cfg = load_train_config(None, [f"model={TOKENIZER}", f"device={DEVICE}", "model_dtype=bfloat16",
                                           f"optimizer={optimizer}", "steps=3", "checkpoint_every=0", f"algorithm={name}",
                                           "delay.d=2", "gradient_checkpointing=true", "micro_batch_tokens=256"])
            reset_peak()
            Trainer(cfg, Path(tmp) / name, progress=False).run()
            rows = read_jsonl(Path(tmp) / name / "metrics.jsonl")
            out[name] = {"loss": [r["train/loss"] for r in rows], "step_seconds": [r["time/step_seconds"] for r in rows],
                         "peak_gpu_gb": peak_gb()}
    return out


def hf_engine(model, tok) -> dict:
    """Decoder agreement with the model's forward, and HFEngine tokens/s with either decoder."""
    import gmc.rollout
    from gmc.data import PLAIN_TEMPLATE
    from gmc.decoding import HFDecoder, Qwen3Decoder
    from gmc.engines import SamplingConfig
    from gmc.policy import position_ids_from_mask
    from gmc.rollout import HFEngine
    from gmc.synthetic import SyntheticTask

    model = model.to(DEVICE).eval()
    prompts = [PLAIN_TEMPLATE.format(problem=r.problem) for r in SyntheticTask().generate("test", 32)]
    enc = tok(prompts[:8], return_tensors="pt", padding=True, add_special_tokens=False).to(DEVICE)
    tokens = torch.randint(2, len(tok), (8, 16), device=DEVICE)
    ids, mask = torch.cat([enc["input_ids"], tokens], 1), torch.cat([enc["attention_mask"], torch.ones_like(tokens)], 1)
    P = enc["input_ids"].shape[1]
    with torch.inference_mode():
        ref = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits[:, P - 1 : -1]
        decoder = Qwen3Decoder(model, ids.shape[1])
        got = [decoder.prefill(enc["input_ids"], enc["attention_mask"])]
        got += [decoder.step(tokens[:, j]) for j in range(tokens.shape[1] - 1)]
    out = {"max_abs_logit_diff_bf16": float((torch.stack(got, 1).float() - ref.float()).abs().max()),
           "logit_scale": float(ref.float().abs().max())}
    sampling = SamplingConfig(max_new_tokens=32 if SMALL else 256)
    lean = gmc.rollout.make_decoder
    try:
        for name, make in [("lean", lean), ("model_forward", lambda m, capacity: HFDecoder(m))]:
            gmc.rollout.make_decoder = make
            engine = HFEngine(model, tok, seed=0)
            engine.generate(prompts[:4], 8, sampling)
            sync()
            t = time.perf_counter()
            groups = engine.generate(prompts, 8, sampling)
            sync()
            n = sum(s.length for g in groups for s in g)
            out[name] = {"tokens": n, "tokens_per_s": n / (time.perf_counter() - t)}
    finally:
        gmc.rollout.make_decoder = lean
    out["ratio_lean_over_model_forward"] = out["lean"]["tokens_per_s"] / out["model_forward"]["tokens_per_s"]
    return out


def paper_shape_update(vocab: int) -> dict:
    """One update (no-grad pass, loss, micro-batched backward, optimizer step) at the paper's
    batch shape, within the preset's token budget, float32 masters under bfloat16 autocast."""
    from gmc.asynchrony import Group
    from gmc.estimators import ESTIMATORS, EstimatorConfig
    from gmc.update import Update

    B, G, P, T, budget = (4, 4, 16, 64, 256) if SMALL else (32, 32, 64, 4096, 16384)
    model = qwen3_0_6b(vocab).float().to(DEVICE)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    groups = [Group(prompt_index=b, prompt_ids=torch.randint(0, vocab, (P,)), response_ids=torch.randint(0, vocab, (G, T)),
                    response_mask=torch.ones(G, T, dtype=torch.bool), rewards=torch.arange(G).float() % 2,
                    behaviour_logp=torch.full((G, T), -11.0), sampler_logp=torch.zeros(G, T), version=0)
              for b in range(B)]
    if HAS_BNB:
        import bitsandbytes as bnb

        opt = bnb.optim.AdamW8bit(model.parameters(), lr=1e-6)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    update = Update(model, ESTIMATORS["gmc"], EstimatorConfig(max_new_tokens=T), budget, pad_id=0, chunk_size=1024,
                    compute_dtype=torch.bfloat16)
    sync()
    reset_peak()
    t = time.perf_counter()
    loss, stats, _ = update.backward(groups, on_policy=False)
    sync()
    backward_s = time.perf_counter() - t
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync()
    return {"rows": B * G, "tokens": B * G * (P + T), "budget": budget, "optimizer": type(opt).__name__,
            "parameters": sum(p.numel() for p in model.parameters()), "backward_seconds": backward_s,
            "seconds": time.perf_counter() - t, "peak_gpu_gb": peak_gb(), "loss": float(loss),
            "frac_groups_capped": stats["ratio/frac_groups_capped"]}


def train_8bit(model_dir: str) -> dict:
    """Five training steps of the random Qwen3-0.6B shape with 8-bit AdamW through ``gmc train``'s loop."""
    from gmc.config import load_train_config
    from gmc.io import read_jsonl
    from gmc.trainer import Trainer

    cfg = load_train_config(None, [f"model={model_dir}", f"device={DEVICE}", "model_dtype=bfloat16", "optimizer=adamw8bit",
                                   "steps=5", "checkpoint_every=0", "lr=1e-6", "prompts_per_step=8", "group_size=8",
                                   "delay.d=2", f"sampling.max_new_tokens={32 if SMALL else 256}", "engine=hf"])
    run = Path(model_dir) / "run"
    reset_peak()
    t = time.perf_counter()
    Trainer(cfg, run, progress=False).run()
    rows = read_jsonl(run / "metrics.jsonl")
    return {"seconds": time.perf_counter() - t, "step_seconds": [r["time/step_seconds"] for r in rows],
            "loss": [r["train/loss"] for r in rows], "peak_gpu_gb": peak_gb()}


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
    from transformers import AutoTokenizer

    part("estimators", estimators)
    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    with tempfile.TemporaryDirectory() as tmp:
        model = qwen3_0_6b(len(tok))
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        part("hf_engine", hf_engine, model, tok)
        model.cpu()
        if HAS_BNB:
            part("train_8bit_adamw", train_8bit, tmp)
        else:
            result["train_8bit_adamw"] = "skipped: bitsandbytes is not installed"
        part("paper_shape_update", paper_shape_update, 151936)  # the longest part (about 5 min on an H200)
        if importlib.util.find_spec("vllm"):
            part("vllm", vllm_engine, tmp, model)
        else:
            result["vllm"] = "skipped: vllm is not installed"
    (OUT / "gpu.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
