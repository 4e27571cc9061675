"""Evaluation: greedy accuracy and Pass@1 on benchmarks for one checkpoint (method.md section 5).

The model is loaded once. For each benchmark: greedy decoding (temperature 0, one answer per
problem) gives the greedy accuracy; ``k`` samples per problem (temperature and top-p settable)
give Pass@1, the mean correctness over samples, with its standard error across problems, and
the unbiased pass@k' estimator ``1 - C(n-c, k') / C(n, k')`` for every ``k' <= k``.

Writes ``<out>/<benchmark>.json`` (the summary) and ``<out>/<benchmark>.completions.jsonl``
(every completion with its extracted answer and grade), atomically.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from gmc.data import BENCHMARKS, SyntheticTask, format_prompt, load_dataset
from gmc.io import atomic_path, write_json
from gmc.rewards import Grader
from gmc.rollout import SamplingConfig, VLLMConfig, make_engine

DEFAULT_SAMPLES = {"aime24": 16, "aime25": 16, "amc23": 16, "math500": 4, "minerva_math": 4, "olympiadbench": 4,
                   "synthetic": 4}
"""Samples per problem for Pass@1 (method.md section 5)."""


@dataclass(frozen=True)
class EvalConfig:
    """What ``gmc evaluate`` measures."""

    benchmarks: tuple[str, ...] = ("synthetic",)
    """Benchmark names: the six of method.md and/or ``synthetic`` (the synthetic test split)."""
    samples: dict[str, int] = field(default_factory=dict)
    """Samples per problem for Pass@1, per benchmark (default :data:`DEFAULT_SAMPLES`)."""
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 48
    greedy: bool = True
    """Also decode greedily (temperature 0) for the greedy accuracy."""
    limit: int | None = None
    """Evaluate only the first ``limit`` problems of each benchmark (quick runs)."""
    synthetic_problems: int = 200
    synthetic: SyntheticTask = field(default_factory=SyntheticTask)
    data_root: str | None = None
    data_source: str = "local"
    engine: str = "hf"
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Settings of the vLLM engine (``engine: vllm``), as in training."""
    device: str = "auto"
    model_dtype: str = "float32"
    thinking: bool = False
    seed: int = 1234

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


def summarize(name: str, golds: list[str], greedy_correct: list[bool] | None,
              sample_correct: list[list[bool]]) -> dict:
    n_problems = len(golds)
    k = len(sample_correct[0]) if sample_correct else 0
    out: dict = {"benchmark": name, "problems": n_problems, "k": k}
    if greedy_correct is not None:
        out["greedy"] = sum(greedy_correct) / n_problems
    if k:
        per_problem = [sum(row) / k for row in sample_correct]
        mean = sum(per_problem) / n_problems
        var = sum((p - mean) ** 2 for p in per_problem) / max(1, n_problems - 1)
        out["pass_at_1"] = mean
        out["pass_at_1_se"] = math.sqrt(var / n_problems)
        out["pass_at_k"] = {str(kk): sum(pass_at_k(k, sum(row), kk) for row in sample_correct) / n_problems
                            for kk in range(1, k + 1) if kk == 1 or kk & (kk - 1) == 0 or kk == k}
    return out


def evaluate(model_path: str, out: str | Path, cfg: EvalConfig = EvalConfig(), progress: bool = True) -> dict[str, dict]:
    """Evaluate one checkpoint on ``cfg.benchmarks``; returns the summaries by benchmark."""
    from gmc.policy import load_policy

    out = Path(out)
    model, tokenizer = load_policy(model_path, cfg.model_dtype, cfg.device)
    model.eval()
    engine = make_engine(cfg.engine, model, tokenizer, model_path=model_path, seed=cfg.seed, vllm=cfg.vllm)
    summaries = {}
    with Grader() as grader:
        for name in tqdm(cfg.benchmarks, desc="evaluate", disable=not progress):
            start = time.time()
            records = benchmark_records(name, cfg)
            prompts = [format_prompt(tokenizer, r.problem, cfg.thinking) for r in records]
            golds = [r.answer for r in records]
            rows = []
            greedy_correct = None
            if cfg.greedy:
                groups = engine.generate(prompts, 1, SamplingConfig(0.0, 1.0, cfg.max_new_tokens))
                grades = grader.grade_batch([g[0].text for g in groups], golds)
                greedy_correct = [g.correct for g in grades]
                rows += [{"id": r.id, "mode": "greedy", "sample": 0, "completion": g[0].text, "answer": gr.answer,
                          "gold": r.answer, "correct": gr.correct, "reason": gr.reason, "length": g[0].length}
                         for r, g, gr in zip(records, groups, grades)]
            k = cfg.k_for(name)
            sample_correct: list[list[bool]] = []
            if k:
                sampling = SamplingConfig(cfg.temperature, cfg.top_p, cfg.max_new_tokens)
                groups = engine.generate(prompts, k, sampling)
                grades = grader.grade_batch([s.text for g in groups for s in g], [a for a in golds for _ in range(k)])
                for i, (r, g) in enumerate(zip(records, groups)):
                    row_grades = grades[i * k : (i + 1) * k]
                    sample_correct.append([gr.correct for gr in row_grades])
                    rows += [{"id": r.id, "mode": "sample", "sample": j, "completion": s.text, "answer": gr.answer,
                              "gold": r.answer, "correct": gr.correct, "reason": gr.reason, "length": s.length}
                             for j, (s, gr) in enumerate(zip(g, row_grades))]
            summary = summarize(name, golds, greedy_correct, sample_correct)
            summary.update({"model": str(model_path), "temperature": cfg.temperature, "top_p": cfg.top_p,
                            "max_new_tokens": cfg.max_new_tokens, "seconds": round(time.time() - start, 2)})
            with atomic_path(out / f"{name}.completions.jsonl") as tmp:
                tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
            write_json(out / f"{name}.json", summary)
            summaries[name] = summary
    write_json(out / "eval_config.json", asdict(cfg))
    return summaries
