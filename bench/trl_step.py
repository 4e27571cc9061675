"""Training step against TRL's GRPOTrainer: the same tiny model, prompts per step, group size,
token limit, sampling (temperature 1, top_p 1), reward (our grader), learning rate and
optimizer (AdamW), on CPU without vLLM, one optimizer step per generation batch, no KL.

Ours: ``gmc`` trainer in synchronous mode (generate, grade, behaviour log-probs, loss, step).
Theirs: ``trl.GRPOTrainer``. Reports the median seconds per step after warm-up, completion
tokens per second, and the ratio. The variants run in alternation (``REPEATS`` runs each, the
order rotating every time) and their steps are pooled, so all see the same machine. With
``--baseline CHECKOUT`` the trainer of another checkout of gmc (an earlier commit, say) runs as a
third variant, in a subprocess importing that checkout, on the same settings. Needs the bench
extra (``pip install -e '.[bench]'``).
Run: python bench/trl_step.py [MODEL_DIR] [STEPS] [REPEATS] [--baseline CHECKOUT]
"""

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from gmc.io import read_jsonl  # noqa: E402
from gmc.run.config import load_train_config  # noqa: E402
from gmc.run.trainer import Trainer  # noqa: E402
from gmc.tasks.datasets import PLAIN_TEMPLATE  # noqa: E402
from gmc.tasks.grading import Grader  # noqa: E402
from gmc.tasks.synthetic import SyntheticTask  # noqa: E402

PROMPTS, G, MAX_NEW, LR = 8, 8, 48, 2e-4


def our_config(model_dir: str, steps: int, *overrides: str):
    """Our synchronous run with the settings both systems share (``key=value`` overrides last)."""
    return load_train_config(
        None,
        [
            f"model={model_dir}",
            "device=cpu",
            f"steps={steps}",
            "checkpoint_every=0",
            "algorithm=grpo",
            "delay.mode=sync",
            f"group_size={G}",
            f"prompts_per_step={PROMPTS}",
            f"lr={LR}",
            f"sampling.max_new_tokens={MAX_NEW}",
            *overrides,
        ],
    )


def step_stats(metrics: Path) -> dict:
    """Step times, tokens and final reward of a run's metrics after two warm-up steps."""
    rows = read_jsonl(metrics)[2:]
    return {
        "step_seconds": [r["time/step_seconds"] for r in rows],
        "tokens": [r["rollout/response_length_mean"] * r["rollout/samples"] for r in rows],
        "reward_last": statistics.mean(r["rollout/reward_mean"] for r in rows[-5:]),
    }


def run_ours(model_dir: str, steps: int, out: Path) -> dict:
    Trainer(our_config(model_dir, steps), out, progress=False).run()
    return step_stats(out / "metrics.jsonl")


def run_checkout(checkout: str, model_dir: str, steps: int, out: Path) -> dict:
    """:func:`run_ours` with the gmc of another checkout (and its own ``bench/trl_step.py`` settings),
    in a subprocess that imports that checkout first."""
    code = (
        f"import sys; sys.path.insert(0, {checkout!r}); sys.path.insert(1, {checkout + '/bench'!r})\n"
        "import trl_step\nfrom gmc.run.trainer import Trainer\n"
        f"Trainer(trl_step.our_config({model_dir!r}, {steps}), {str(out)!r}, progress=False).run()\n"
        "import gmc; print(gmc.__file__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1].startswith(checkout), done.stdout
    return step_stats(out / "metrics.jsonl")


def run_trl(model_dir: str, steps: int, out: Path) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    records = SyntheticTask().generate("train", 2000, seed=0)
    data = Dataset.from_list(
        [{"prompt": PLAIN_TEMPLATE.format(problem=r.problem), "answer": r.answer} for r in records]
    )
    grader = Grader()

    def reward(completions, answer, **_):
        return [g.reward for g in grader.grade_batch(completions, answer)]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=PROMPTS * G,
        num_generations=G,
        max_completion_length=MAX_NEW,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=LR,
        beta=0.0,
        num_iterations=1,
        gradient_accumulation_steps=1,
        max_steps=steps,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        lr_scheduler_type="constant",
        warmup_steps=0,
        bf16=False,
        disable_dropout=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok, callbacks=[Timer()]
    )
    trainer.train()
    grader.close()
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h][2:]
    return {
        "step_seconds": times[2:],
        "tokens": [h["completions/mean_length"] * PROMPTS * G for h in logs],
        "reward_last": statistics.mean(h["reward"] for h in logs[-5:]),
    }


def pooled(runs: list[dict]) -> dict:
    step = statistics.median(t for r in runs for t in r["step_seconds"])
    tokens = statistics.mean(n for r in runs for n in r["tokens"])
    return {
        "step_seconds_median": step,
        "completion_tokens_per_step": tokens,
        "tokens_per_s": tokens / step,
        "runs": len(runs),
        "reward_last": [r["reward_last"] for r in runs],
    }


def main() -> None:
    args = sys.argv[1:]
    baseline = None
    if "--baseline" in args:
        i = args.index("--baseline")
        baseline = str(Path(args[i + 1]).resolve())
        del args[i : i + 2]
    model_dir = args[0] if len(args) > 0 else "results/models/tiny/seed~0"
    steps = int(args[1]) if len(args) > 1 else 20
    repeats = int(args[2]) if len(args) > 2 else 2
    variants = {"gmc": run_ours, "trl": run_trl}
    if baseline:
        variants["baseline"] = lambda m, s, out: run_checkout(baseline, m, s, out)
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    names = list(variants)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                runs[name].append(variants[name](model_dir, steps, Path(tmp) / f"{name}{r}"))
    ours, trl = pooled(runs["gmc"]), pooled(runs["trl"])
    result = {
        "prompts_per_step": PROMPTS,
        "group_size": G,
        "max_new_tokens": MAX_NEW,
        "steps": steps,
        "gmc": ours,
        "trl": trl,
        "throughput_ratio_gmc_over_trl": ours["tokens_per_s"] / trl["tokens_per_s"],
        "step_time_ratio_trl_over_gmc": trl["step_seconds_median"] / ours["step_seconds_median"],
    }
    if baseline:
        base = pooled(runs["baseline"])
        result.update(
            baseline={"checkout": baseline, **base},
            step_time_ratio_baseline_over_gmc=base["step_seconds_median"] / ours["step_seconds_median"],
        )
    write_result("trl_step", result)


if __name__ == "__main__":
    main()
