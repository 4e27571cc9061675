"""What several test modules share: the repository's paths, the documentation's pages, builders
of fake runs, sweeps and samples, and a random two-layer policy with groups of rollouts to train
it on. Fixtures live in ``conftest.py``."""

import json
import shutil
from pathlib import Path

import torch

from gmc.estimators import group_advantages
from gmc.policy.logprobs import Rows, sequence_logprobs
from gmc.rollouts.groups import Group
from gmc.tasks.datasets import PLAIN_TEMPLATE
from gmc.tasks.synthetic import SyntheticTask

REPO = Path(__file__).resolve().parents[1]
"""The repository's root."""
DOCS = [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md") if "published" not in p.parts)]
"""The README and every page of the documentation (the bundles' files, reached through the
``docs/published`` link, are not pages)."""


STALE_SHAPE = (4, 4, 10)
"""``B, G, T`` of :func:`stale_batch`: four groups of four responses of up to ten tokens."""


def stale_batch(seed, scale=0.4):
    """Log-probs ``[B, G, T]`` (:data:`STALE_SHAPE`) far enough from the behaviour's that every clip,
    mask and cap fires; the behaviour's, the mask (lengths 2 to T) and group advantages of 0/1
    rewards."""
    B, G, T = STALE_SHAPE
    g = torch.Generator().manual_seed(seed)
    logp_b = -torch.rand(B, G, T, generator=g) * 2 - 0.05
    logp = (logp_b + scale * torch.randn(B, G, T, generator=g)).clamp(max=-1e-3)
    lengths = torch.randint(2, T + 1, (B, G), generator=g)
    mask = torch.arange(T).expand(B, G, T) < lengths.unsqueeze(-1)
    adv = group_advantages(torch.randint(0, 2, (B, G), generator=g).float())
    return logp, logp_b, mask, adv


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


VOCAB = 96
"""The vocabulary of :func:`random_model` and :func:`random_groups`."""


def random_model(seed=0, dtype=torch.float32, checkpointing=False):
    """A two-layer Qwen3 of random weights over a vocabulary of ``VOCAB`` tokens."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    model = Qwen3ForCausalLM(cfg).to(dtype)
    if checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    return model


def random_groups(B=3, G=4, seed=0, stale=True):
    """Groups (of :data:`VOCAB` tokens) with prompts of different lengths and responses of 0..20 tokens."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for b in range(B):
        P = int(torch.randint(3, 12, (1,), generator=g))
        lengths = torch.randint(0, 21, (G,), generator=g)
        lengths[0] = 20
        T = int(lengths.max())
        resp = torch.randint(1, VOCAB, (G, T), generator=g)
        mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
        behaviour = torch.where(mask, -torch.rand(G, T, generator=g) * 3 - 2, 0.0) if stale else None
        groups.append(
            Group(
                prompt_index=b,
                prompt_ids=torch.randint(1, VOCAB, (P,), generator=g),
                response_ids=resp,
                response_mask=mask,
                rewards=torch.randint(0, 2, (G,), generator=g).float(),
                behaviour_logp=behaviour,
                sampler_logp=torch.zeros(G, T),
                version=0,
            )
        )
    return groups


def naive_logprobs(model, rows: Rows, temperature=1.0) -> list[torch.Tensor]:
    """Each row alone through the model's own forward and a full log-softmax."""
    out = []
    for seq, P, n in zip(rows.sequences, rows.prompt_lengths, rows.lengths):
        logits = model(input_ids=seq.unsqueeze(0)).logits[0].float() / temperature
        lp = torch.log_softmax(logits, -1)[P - 1 : P - 1 + n].gather(-1, seq[P : P + n].unsqueeze(-1)).squeeze(-1)
        out.append(lp)
    return out


def grads(model):
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def with_sampler(groups, seed, scale=0.2, model=None):
    """The groups with sampler log-probs apart from their behaviour's (the trainer's at the
    generating version; ``model``'s for on-policy groups), as an engine with other numerics gives."""
    g = torch.Generator().manual_seed(seed)
    if model is not None:
        current = sequence_logprobs(model, Rows.from_groups(groups), 0, 0)
    for k, grp in enumerate(groups):
        G, T = grp.response_ids.shape
        base = grp.behaviour_logp if model is None else current[k * G : (k + 1) * G, :T]
        grp.sampler_logp = torch.where(grp.response_mask, base + scale * torch.randn(base.shape, generator=g), 0.0)
    return groups
