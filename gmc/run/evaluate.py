"""Evaluation: greedy accuracy and Pass@1 on benchmarks for one checkpoint (method.md section 5).

The model is loaded once. For each benchmark: greedy decoding (temperature 0, one answer per
problem) gives the greedy accuracy; ``k`` samples per problem (temperature and top-p settable)
give Pass@1, the mean correctness over samples, with its standard error across problems, and
the unbiased pass@k' estimator ``1 - C(n-c, k') / C(n, k')`` for every ``k' <= k``.

Writes ``<out>/<benchmark>.json`` (the summary) and ``<out>/<benchmark>.completions.jsonl``
(every completion with its extracted answer and grade), atomically. The engine is called on
chunks of about ``SAMPLES_PER_CALL`` completions, and the progress bar of each benchmark counts
its completions (problems times ``1 + k``).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field
from tqdm import tqdm

from gmc.io import atomic_path, write_json
from gmc.rollouts.engines import ENGINES, HFConfig, SamplingConfig, VLLMConfig, make_engine
from gmc.settings import Fraction, NonNegativeInt, PositiveInt, registered, settings, to_dict
from gmc.tasks.datasets import BENCHMARKS, benchmark_specs, format_prompt, load_dataset
from gmc.tasks.grading import Grader
from gmc.tasks.synthetic import SyntheticTask

DEFAULT_SAMPLES = {name: spec.k for name, spec in benchmark_specs().items()}
"""Samples per problem for Pass@1 (method.md section 5), from the benchmark registry."""
SAMPLES_PER_CALL = 512
"""Completions per engine call (a chunk of problems with all their samples)."""


BenchmarkName = registered(lambda: benchmark_specs(), "benchmark")


@settings
class EvalConfig:
    """What ``gmc evaluate`` measures."""

    benchmarks: Annotated[tuple[BenchmarkName, ...], Field(min_length=1)] = ("synthetic",)
    """Benchmark names: the six of method.md and/or ``synthetic`` (the synthetic test split)."""
    samples: dict[BenchmarkName, NonNegativeInt] = field(default_factory=dict)
    """Samples per problem for Pass@1, per benchmark (default: the benchmark's ``k``, :data:`DEFAULT_SAMPLES`)."""
    temperature: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)] = 0.6
    """Sampling temperature of the Pass@1 samples (0: greedy samples)."""
    top_p: Fraction = 0.95
    """Nucleus sampling threshold of the Pass@1 samples."""
    max_new_tokens: PositiveInt = 48
    """Token limit of every answer, greedy and sampled."""
    greedy: bool = True
    """Also decode greedily (temperature 0) for the greedy accuracy."""
    limit: PositiveInt | None = None
    """Evaluate only the first ``limit`` problems of each benchmark (quick runs); None: all."""
    synthetic_problems: PositiveInt = 200
    """Problems of the ``synthetic`` benchmark (the synthetic task's test split)."""
    synthetic: SyntheticTask = field(default_factory=SyntheticTask)
    """Difficulty knobs of the synthetic task (as in training)."""
    data_root: str | None = None
    """Local data root (default ``$GMC_DATA_ROOT``, else ``data/`` in the repository)."""
    data_source: Literal["local", "hub"] = "local"
    """Registered benchmarks: read the local copy or the Hugging Face hub."""
    engine: registered(lambda: ENGINES, "rollout engine") = "hf"
    """Decoding engine, a key of :data:`gmc.rollouts.engines.ENGINES`: ``hf`` (any machine) or ``vllm`` (GPU)."""
    hf: HFConfig = field(default_factory=HFConfig)
    """Settings of the HF engine (a per-token wall-clock cost for benchmarks)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Settings of the vLLM engine (``engine: vllm``), as in training."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``."""
    model_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of the evaluated model."""
    thinking: bool = False
    """Qwen3 thinking mode in the chat template."""
    seed: NonNegativeInt = 1234
    """Seed of the sampled answers."""

    def k_for(self, name: str) -> int:
        return int(self.samples.get(name, DEFAULT_SAMPLES.get(name, 4)))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (Chen et al., 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def benchmark_records(name: str, cfg: EvalConfig):
    if name == "synthetic":
        records = cfg.synthetic.generate("test", cfg.synthetic_problems, seed=0)
    elif name in BENCHMARKS:
        records = load_dataset(name, source=cfg.data_source, root=cfg.data_root)
    else:
        raise ValueError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS) + ['synthetic']}")
    return records[: cfg.limit] if cfg.limit else records


def summarize(
    name: str,
    golds: list[str],
    greedy_correct: list[bool] | None,
    sample_correct: list[list[bool]],
    ids: list[str] | None = None,
) -> dict:
    """An evaluation's summary: greedy accuracy, Pass@1 with its standard error across problems,
    pass@k, and per problem what the scores average (``per_problem``: greedy 0/1, correct samples
    out of ``k``) with a fingerprint of the problems (``problems_sha256``), so that two
    evaluations on the same problems can be paired problem by problem."""
    n_problems = len(golds)
    k = len(sample_correct[0]) if sample_correct else 0
    out: dict = {"benchmark": name, "problems": n_problems, "k": k}
    per: dict = {}
    if greedy_correct is not None:
        out["greedy"] = sum(greedy_correct) / n_problems
        per["greedy"] = [int(c) for c in greedy_correct]
    if k:
        per_problem = [sum(row) / k for row in sample_correct]
        mean = sum(per_problem) / n_problems
        var = sum((p - mean) ** 2 for p in per_problem) / max(1, n_problems - 1)
        out["pass_at_1"] = mean
        out["pass_at_1_se"] = math.sqrt(var / n_problems)
        out["pass_at_k"] = {
            str(kk): sum(pass_at_k(k, sum(row), kk) for row in sample_correct) / n_problems
            for kk in range(1, k + 1)
            if kk == 1 or kk & (kk - 1) == 0 or kk == k
        }
        per["correct"] = [sum(row) for row in sample_correct]
    out["per_problem"] = per
    if ids is not None:
        out["problems_sha256"] = hashlib.sha256("\n".join(map(str, ids)).encode()).hexdigest()[:16]
    return out


def _generate(engine, prompts: list[str], k: int, sampling: SamplingConfig, bar) -> list:
    """``engine.generate(prompts, k, sampling)`` in chunks of problems, advancing ``bar`` by the
    completions of each chunk."""
    step = max(1, SAMPLES_PER_CALL // k)
    groups = []
    for start in range(0, len(prompts), step):
        chunk = prompts[start : start + step]
        groups += engine.generate(chunk, k, sampling)
        bar.update(len(chunk) * k)
    return groups


def evaluate(
    model_path: str, out: str | Path, cfg: EvalConfig = EvalConfig(), progress: bool = True
) -> dict[str, dict]:
    """Evaluate one checkpoint on ``cfg.benchmarks``; returns the summaries by benchmark."""
    from gmc.policy.model import load_policy

    out = Path(out)
    tasks = {name: benchmark_records(name, cfg) for name in cfg.benchmarks}  # bad data fails before the model loads
    model, tokenizer = load_policy(model_path, cfg.model_dtype, cfg.device)
    model.eval()
    engine = make_engine(
        cfg.engine, model, tokenizer, model_path=model_path, seed=cfg.seed, settings=getattr(cfg, cfg.engine, None)
    )
    summaries = {}
    with Grader(start_method=ENGINES[cfg.engine].grading_start) as grader:
        for name in cfg.benchmarks:
            start = time.time()
            records = tasks[name]
            prompts = [format_prompt(tokenizer, r.problem, cfg.thinking) for r in records]
            golds = [r.answer for r in records]
            rows = []
            greedy_correct = None
            k = cfg.k_for(name)
            bar = tqdm(
                total=len(records) * (int(cfg.greedy) + k),
                desc=f"evaluate {name} ({len(records)} problems)",
                unit="completion",
                disable=not progress,
            )
            if cfg.greedy:
                groups = _generate(engine, prompts, 1, SamplingConfig(0.0, 1.0, cfg.max_new_tokens), bar)
                grades = grader.grade_batch([g[0].text for g in groups], golds)
                greedy_correct = [g.correct for g in grades]
                rows += [
                    {
                        "id": r.id,
                        "mode": "greedy",
                        "sample": 0,
                        "completion": g[0].text,
                        "answer": gr.answer,
                        "gold": r.answer,
                        "correct": gr.correct,
                        "reason": gr.reason,
                        "length": g[0].length,
                    }
                    for r, g, gr in zip(records, groups, grades)
                ]
            sample_correct: list[list[bool]] = []
            if k:
                sampling = SamplingConfig(cfg.temperature, cfg.top_p, cfg.max_new_tokens)
                groups = _generate(engine, prompts, k, sampling, bar)
                grades = grader.grade_batch([s.text for g in groups for s in g], [a for a in golds for _ in range(k)])
                for i, (r, g) in enumerate(zip(records, groups)):
                    row_grades = grades[i * k : (i + 1) * k]
                    sample_correct.append([gr.correct for gr in row_grades])
                    rows += [
                        {
                            "id": r.id,
                            "mode": "sample",
                            "sample": j,
                            "completion": s.text,
                            "answer": gr.answer,
                            "gold": r.answer,
                            "correct": gr.correct,
                            "reason": gr.reason,
                            "length": s.length,
                        }
                        for j, (s, gr) in enumerate(zip(g, row_grades))
                    ]
            bar.close()
            summary = summarize(name, golds, greedy_correct, sample_correct, [r.id for r in records])
            summary.update(
                {
                    "model": str(model_path),
                    "temperature": cfg.temperature,
                    "top_p": cfg.top_p,
                    "max_new_tokens": cfg.max_new_tokens,
                    "seconds": round(time.time() - start, 2),
                }
            )
            with atomic_path(out / f"{name}.completions.jsonl") as tmp:
                tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
            write_json(out / f"{name}.json", summary)
            summaries[name] = summary
    write_json(out / "eval_config.json", to_dict(cfg))
    return summaries


# ---------------------------------------------------------------------------------------------
# reading evaluations back

SE = "_se"
"""Suffix of a score's evaluation standard error (``eval/<benchmark>/pass_at_1_se``)."""
SCORES = ("greedy", "pass_at_1")
"""The scores of an evaluation, as ``eval/<benchmark>/<score>``."""


def problem_scores(eval_dir: str | Path) -> dict[str, tuple[str, list[float]]]:
    """Per problem what ``eval/<benchmark>/greedy`` and ``eval/<benchmark>/pass_at_1`` average
    (greedy 0/1, the fraction of samples correct), each with the fingerprint of its problems;
    empty for evaluations that did not record them."""
    out = {}
    for f in sorted(Path(eval_dir).glob("*.json")):
        if f.name == "eval_config.json":
            continue
        ev = json.loads(f.read_text())
        per, sha, name = ev.get("per_problem") or {}, ev.get("problems_sha256"), f"eval/{ev['benchmark']}"
        if sha is None:
            continue
        if "greedy" in per:
            out[f"{name}/greedy"] = (sha, [float(c) for c in per["greedy"]])
        if "correct" in per and ev.get("k"):
            out[f"{name}/pass_at_1"] = (sha, [c / ev["k"] for c in per["correct"]])
    return out


def eval_scores(eval_dir: str | Path) -> dict[str, float]:
    """``eval/<benchmark>/greedy`` and ``eval/<benchmark>/pass_at_1`` from an evaluation folder,
    each with its standard error across problems (``..._se``; binomial for greedy)."""
    out = {}
    for f in sorted(Path(eval_dir).glob("*.json")):
        if f.name == "eval_config.json":
            continue
        ev = json.loads(f.read_text())
        name = f"eval/{ev['benchmark']}"
        if "greedy" in ev:
            out[f"{name}/greedy"] = ev["greedy"]
            n = ev.get("problems", 0)
            out[f"{name}/greedy{SE}"] = math.sqrt(ev["greedy"] * (1 - ev["greedy"]) / (n - 1)) if n > 1 else math.nan
        if "pass_at_1" in ev:
            out[f"{name}/pass_at_1"] = ev["pass_at_1"]
            out[f"{name}/pass_at_1{SE}"] = ev.get("pass_at_1_se", math.nan)
    return out
