"""The tiny CPU policy: ``build_tiny_model`` makes the default policy of the CPU run, a small
Qwen3-architecture model (random init) with a byte-level BPE tokenizer trained on the synthetic
arithmetic task, warm started by supervised training on worked solutions until a target greedy
accuracy, so that RL has room to improve (method.md section 5; the paper's models are Qwen3 from
the hub). A warm start may be held to a rule fixed before any RL run (``accept_accuracy``,
judged on the synthetic task's validation split, which no run trains or evaluates on): one the
rule rejects is replaced by a warm start from another seed, and the build's summary reports
every attempt.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from dataclasses import field
from pathlib import Path
from typing import Annotated

from pydantic import Field

from gmc.policy.build import Qwen3Shape, count_parameters, qwen3_model, save_model, train_tokenizer
from gmc.settings import ConfigError, Positive, PositiveInt, settings, to_dict
from gmc.tasks.synthetic import SyntheticTask

log = logging.getLogger(__name__)


@settings
class TinyModelConfig(Qwen3Shape):
    """The tiny CPU policy and its warm start (the shape defaults are :class:`Qwen3Shape`'s)."""

    vocab_size: PositiveInt = 384
    """BPE vocabulary (256 byte symbols + merges + special tokens)."""
    target_accuracy: Annotated[float, Field(ge=0, le=1)] | None = None
    """Stop the warm start at the first check whose greedy accuracy on held-out problems reaches
    this; None trains exactly ``max_steps``. A threshold makes the stopping step depend on float
    rounding (the accuracy jumps between checks), so a sweep uses a fixed step count."""
    answer_noise: Annotated[float, Field(ge=0, le=1)] = 0.5
    """Fraction of warm-start solutions whose boxed answer is off by one (the worked steps stay
    right). The warm-started policy then hesitates between the right answer and its neighbour
    after a right computation: a mistake that greedy decoding makes about half the time and
    that RL can learn away within a few hundred steps."""
    max_steps: PositiveInt = 500
    """Steps of the warm start (at most, with a ``target_accuracy``): the build stops on steps or
    accuracy, never on wall-clock time, so the model it makes does not depend on the machine's
    speed."""
    batch_size: PositiveInt = 64
    """Worked solutions per warm-start step."""
    lr: Positive = 3e-3
    """Warm-start learning rate (AdamW, 50 steps of linear warm-up)."""
    eval_every: PositiveInt = 50
    """Warm-start steps between two checks of the held-out greedy accuracy."""
    eval_problems: PositiveInt = 128
    """Held-out problems of each accuracy check."""
    synthetic: SyntheticTask = field(default_factory=SyntheticTask)
    """The synthetic task whose worked solutions the warm start teaches (the workflow's
    ``synthetic`` section)."""
    accept_accuracy: Annotated[float, Field(ge=0, le=1)] | None = None
    """The acceptance rule of a warm start: its final greedy accuracy on ``accept_problems``
    problems of the synthetic task's validation split (``synthetic.validation_fraction > 0``) must
    reach this; a warm start that does not is replaced by one from the next replacement seed
    (``seed + 1000 k``), at most ``max_attempts`` in all (then the build fails). None: no rule."""
    accept_problems: PositiveInt = 200
    """Validation problems the acceptance rule judges a warm start on."""
    max_attempts: PositiveInt = 3
    """Warm starts the acceptance rule may try before the build fails."""

    def __post_init__(self) -> None:
        if self.accept_accuracy is not None and self.synthetic.validation_fraction == 0:
            raise ConfigError(
                "the acceptance rule judges a warm start on the validation split, which needs "
                "synthetic.validation_fraction > 0",
                "accept_accuracy",
            )


REPLACEMENT_STRIDE = 1000
"""A rejected warm start of seed ``s`` is replaced by one of seed ``s + 1000``, then ``s + 2000``."""


def build_tiny_model(out: str | Path, cfg: TinyModelConfig = TinyModelConfig(), progress: bool = True) -> dict:
    """Build, warm-start and save the tiny policy under ``out``; returns a summary dict. Under an
    acceptance rule (``accept_accuracy``) a rejected warm start is replaced by one of the next
    replacement seed; the summary lists every attempt (``attempts``) and says whether the seed's
    model is a replacement (``replaced``)."""
    attempts = []
    for k in range(cfg.max_attempts if cfg.accept_accuracy is not None else 1):
        seed = cfg.seed + REPLACEMENT_STRIDE * k
        model, tokenizer, summary = _warm_start(dataclasses.replace(cfg, seed=seed), progress)
        if cfg.accept_accuracy is None:
            break
        score = validation_accuracy(model, tokenizer, cfg, summary["max_new_tokens"])
        attempts.append({"seed": seed, "validation_greedy_accuracy": score, "accepted": score >= cfg.accept_accuracy})
        log.info(
            "warm start of seed %d: validation greedy accuracy %.3f (the rule asks %.3f): %s",
            seed,
            score,
            cfg.accept_accuracy,
            "accepted" if attempts[-1]["accepted"] else "rejected",
        )
        if attempts[-1]["accepted"]:
            break
    else:
        raise RuntimeError(
            f"no warm start of seed {cfg.seed} met the acceptance rule (validation greedy accuracy >= "
            f"{cfg.accept_accuracy}) in {cfg.max_attempts} attempts: {attempts}"
        )
    summary.update(attempts=attempts, replaced=len(attempts) > 1, config=to_dict(cfg))
    save_model(out, model, tokenizer, summary)
    return summary


def validation_accuracy(model, tokenizer, cfg: TinyModelConfig, max_new_tokens: int) -> float:
    """Greedy accuracy on ``cfg.accept_problems`` problems of the validation split (the same ones
    for every seed: the rule is one bar)."""
    from gmc.rollouts.engines import SamplingConfig
    from gmc.rollouts.hf_engine import HFEngine
    from gmc.tasks.answers import extract_answer
    from gmc.tasks.datasets import PLAIN_TEMPLATE
    from gmc.tasks.grading import fast_verdict

    problems = cfg.synthetic.generate("validation", cfg.accept_problems, seed=0)
    model.eval()
    groups = HFEngine(model, tokenizer, seed=0).generate(
        [PLAIN_TEMPLATE.format(problem=r.problem) for r in problems],
        1,
        SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens),
    )
    return sum(bool(fast_verdict(r.answer, extract_answer(g[0].text) or "")) for r, g in zip(problems, groups)) / len(
        problems
    )


def _warm_start(cfg: TinyModelConfig, progress: bool):
    """One warm start of ``cfg.seed``: the model, its tokenizer and its summary."""
    import torch
    from tqdm import tqdm

    from gmc.policy.model import position_ids_from_mask
    from gmc.rollouts.engines import SamplingConfig
    from gmc.rollouts.hf_engine import HFEngine
    from gmc.tasks.answers import extract_answer
    from gmc.tasks.datasets import PLAIN_TEMPLATE
    from gmc.tasks.grading import fast_verdict
    from gmc.tasks.synthetic import solution_steps

    start = time.time()
    task = cfg.synthetic
    train = task.generate("train", 5000, seed=cfg.seed)
    held_out = task.generate("test", cfg.eval_problems, seed=cfg.seed + 1)
    prompts = [PLAIN_TEMPLATE.format(problem=r.problem) for r in train]
    noise = random.Random(cfg.seed)
    targets = [" " + solution_steps(r.meta["expression"], int(noise.random() < cfg.answer_noise)) for r in train]
    tokenizer = train_tokenizer([p + t for p, t in zip(prompts, targets)], cfg.vocab_size)
    model = qwen3_model(
        cfg,
        len(tokenizer),
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rope_theta=10000.0,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    eos = tokenizer.eos_token
    engine = HFEngine(model, tokenizer, seed=cfg.seed)
    # room for the longest worked solution of the training set and its end token
    longest = max(len(ids) for ids in tokenizer(targets)["input_ids"])
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=max(48, longest + 8))

    def accuracy() -> float:
        model.eval()
        groups = engine.generate([PLAIN_TEMPLATE.format(problem=r.problem) for r in held_out], 1, greedy)
        model.train()
        return sum(
            bool(fast_verdict(r.answer, extract_answer(g[0].text) or "")) for r, g in zip(held_out, groups)
        ) / len(held_out)

    gen = torch.Generator().manual_seed(cfg.seed)
    acc, step, history = 0.0, 0, []
    bar = tqdm(total=cfg.max_steps, desc="warm start", disable=not progress)
    model.train()
    while step < cfg.max_steps:
        idx = torch.randint(0, len(train), (cfg.batch_size,), generator=gen).tolist()
        enc = tokenizer([prompts[i] + targets[i] + eos for i in idx], return_tensors="pt", padding=True)
        n_prompt = [len(tokenizer(prompts[i])["input_ids"]) for i in idx]
        labels = enc["input_ids"].clone()
        labels[enc["attention_mask"] == 0] = -100
        pad = (enc["attention_mask"] == 0).sum(1)
        for row, (p, n) in enumerate(zip(pad.tolist(), n_prompt)):
            labels[row, : p + n] = -100
        fwd = model(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            position_ids=position_ids_from_mask(enc["attention_mask"]),
            labels=labels,
        )
        fwd.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        bar.update(1)
        if step % cfg.eval_every == 0:
            acc = accuracy()
            history.append({"step": step, "loss": float(fwd.loss.detach()), "greedy_accuracy": acc})
            bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", acc=f"{acc:.2f}")
            log.info("warm start step %d: loss %.3f, greedy accuracy %.3f", step, history[-1]["loss"], acc)
            if cfg.target_accuracy is not None and acc >= cfg.target_accuracy:
                break
    bar.close()
    if step % cfg.eval_every:
        acc = accuracy()
    model.eval()
    summary = {
        "steps": step,
        "greedy_accuracy": acc,
        "seconds": round(time.time() - start, 1),
        "threads": torch.get_num_threads(),
        "seed": cfg.seed,
        "max_new_tokens": greedy.max_new_tokens,
        "parameters": count_parameters(model),
        "history": history,
    }
    return model, tokenizer, summary
