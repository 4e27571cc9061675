"""What several test modules share: the repository's paths, the documentation's pages, and
builders of fake runs, sweeps and samples. Fixtures live in ``conftest.py``."""

import json
import shutil
from pathlib import Path

import torch

from gmc.policy.logprobs import Rows, sequence_logprobs
from gmc.tasks.datasets import PLAIN_TEMPLATE
from gmc.tasks.synthetic import SyntheticTask

REPO = Path(__file__).resolve().parents[1]
"""The repository's root."""
DOCS = [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md") if "published" not in p.parts)]
"""The README and every page of the documentation (the bundles' files, reached through the
``docs/published`` link, are not pages)."""


HOSTILE = {
    "newlines": "\n" * 1_000_000,
    "unbalanced boxes": "\\boxed{" * 20_000,
    "nested braces": "\\boxed{" + "{" * 50_000 + "}" * 49_999,
    "phrase then spaces": "the answer is x" + " " * 200_000 + "y",
    "answer line then spaces": "Answer: x" + " " * 200_000 + "y",
    "many phrases": "the answer is $5$ so " * 50_000,
    "nested bold": "\\boxed{" + "\\mathbf{" * 5_000 + "1" + "}" * 5_001,
}


def fake_run(results, algo, delay, group, seed, reward, score, se=None, correct=None):
    """A finished run's summary, reward curve and synthetic evaluation (greedy ``score``, Pass@1
    ``score / 2``); ``correct``: per problem, the samples of 2 it got right (recorded for pairing)."""
    d = results / "train" / f"algo~{algo}" / f"delay~{delay}" / f"group~{group}" / f"seed~{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(
        json.dumps({"steps": 10, "rollout/reward_mean_last20": reward, "ratio/ess_frac": 0.9})
    )
    (d / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": t, "rollout/reward_mean": reward + 0.01 * t}) + "\n" for t in range(12))
    )
    e = results / "eval" / f"algo~{algo}" / f"delay~{delay}" / f"group~{group}" / f"seed~{seed}"
    e.mkdir(parents=True)
    ev = {"benchmark": "synthetic", "greedy": score, "pass_at_1": score / 2, "problems": 101}
    if se is not None:
        ev["pass_at_1_se"] = se
    if correct is not None:
        ev.update(k=2, per_problem={"correct": list(correct)}, problems_sha256="0123456789abcdef")
    (e / "synthetic.json").write_text(json.dumps(ev))


WORKFLOW_TIMEOUT = 1200
"""Seconds for a test that runs the tiny sweep for real (about two minutes on 2 busy cores),
instead of the suite's 300 (pyproject.toml); the 900 s bound of its main Snakemake run comes first."""


def workdir(tmp_path, config: Path) -> Path:
    shutil.copy(config, tmp_path / "config.yaml")
    return tmp_path


def prompts_for(n, seed=0):
    return [PLAIN_TEMPLATE.format(problem=r.problem) for r in SyntheticTask().generate("test", n, seed=seed)]


def packed(tok, flat):
    """``(ids, attention_mask, prompt_len)`` of samples: left-padded prompts, right-padded responses."""
    P = max(len(s.prompt_ids) for s in flat)
    T = max(s.length for s in flat)
    ids = torch.full((len(flat), P + T), tok.pad_token_id)
    attn = torch.zeros(len(flat), P + T, dtype=torch.long)
    for i, s in enumerate(flat):
        ids[i, P - len(s.prompt_ids) : P] = torch.tensor(s.prompt_ids)
        ids[i, P : P + s.length] = torch.tensor(s.token_ids)
        attn[i, P - len(s.prompt_ids) : P + s.length] = 1
    return ids, attn, P


def recomputed_logprobs(model, tok, flat):
    """The policy's log-probs of each sample's response, as the trainer computes them."""
    rows = Rows(
        [torch.tensor(s.prompt_ids + s.token_ids) for s in flat],
        [len(s.prompt_ids) for s in flat],
        [s.length for s in flat],
    )
    return sequence_logprobs(model, rows, 0, tok.pad_token_id)


SCORES = {"gmc": (0.60, 0.64, 0.62), "grpo": (0.40, 0.45, 0.41)}
"""Greedy accuracy per seed at delay 16: gmc − grpo is resolved."""


def sweep(results, scores=SCORES, base=(0.30, 0.33, 0.31)):
    """A finished sweep's results folder: two estimators at delays 0 and 16, three seeds, a base
    model per seed, each run with a checkpoint the bundle must leave out."""
    for algo, per_seed in scores.items():
        for delay in (0, 16):
            for seed, score in enumerate(per_seed):
                point = f"algo~{algo}/delay~{delay}/group~8/seed~{seed}"
                run = results / "train" / point
                run.mkdir(parents=True)
                (run / "summary.json").write_text(json.dumps({"steps": 3, "rollout/reward_mean_last20": score}))
                (run / "config.yaml").write_text(f"algorithm: {algo}\nseed: {seed}\n")
                (run / "run.json").write_text(json.dumps({"git_revision": "abc123", "seed": seed, "threads": 1}))
                (run / "metrics.jsonl").write_text(
                    "".join(
                        json.dumps({"step": t, "rollout/reward_mean": score, "loss": 0.1, "time/step_seconds": 1.0})
                        + "\n"
                        for t in range(3)
                    )
                )
                (run / "checkpoint.pt").write_bytes(b"weights")
                ev = results / "eval" / point
                ev.mkdir(parents=True)
                s = score if delay else score + 0.05
                (ev / "synthetic.json").write_text(
                    json.dumps(
                        {
                            "benchmark": "synthetic",
                            "greedy": s,
                            "pass_at_1": s,
                            "pass_at_1_se": 0.01,
                            "problems": 500,
                            "temperature": 0.6,
                        }
                    )
                )
                (ev / "synthetic.completions.jsonl").write_text("{}\n")
    for seed, score in enumerate(base):
        ev = results / "eval" / "base" / f"seed~{seed}"
        ev.mkdir(parents=True)
        (ev / "synthetic.json").write_text(
            json.dumps(
                {"benchmark": "synthetic", "greedy": score, "pass_at_1": score, "pass_at_1_se": 0.01, "problems": 500}
            )
        )
    (results / "configs" / "train").mkdir(parents=True)
    (results / "configs" / "eval.yaml").write_text("benchmarks: [synthetic]\n")
    return results


def train(tmp_path, name, train_small, **overrides):
    out = tmp_path / name
    train_small(out, **overrides)
    return out
