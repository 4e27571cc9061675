"""The paper-smoke preset: it keeps paper.yaml's settings, plans the expected jobs, and (after
`make test-paper-smoke` ran it) wrote what the paper's sweep writes.

The output checks read ``$GMC_PAPER_SMOKE_RESULTS`` (the results folder of a finished run) and
skip without it, so `make test` stays fast; `make test-paper-smoke` runs the DAG and sets it.
"""

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from helpers import REPO

from gmc.io import flatten
from gmc.results.outputs import FIGURES

PRESETS = REPO / "workflow" / "presets"


SMOKE = yaml.safe_load((PRESETS / "paper_smoke.yaml").read_text())


PAPER = yaml.safe_load((PRESETS / "paper.yaml").read_text())


KEPT = [
    "data_source",
    "train.train_data",
    "train.model_dtype",
    "train.optimizer",
    "train.lr",
    "train.lr_schedule",
    "train.checkpoint_every",
    "train.sampling.temperature",
    "train.sampling.top_p",
    "train.estimator.eps",
    "sweep.algorithm",
    "latency.enabled",
    "latency.algorithm",
    "latency.delay.alpha",
    "latency.delay.step_time",
    "evaluate.benchmarks",
    "evaluate.temperature",
    "evaluate.top_p",
    "evaluate.model_dtype",
]
"""Settings of paper.yaml the smoke run keeps as they are (one seed instead of paper.yaml's
three: the code path is the same, at a third of the cost)."""


def paper_plan_checkpoints() -> bool:
    """Whether the memory plan of paper.yaml's largest run checkpoints the update on 79.6 GiB."""
    from gmc.policy.memory import GIB, plan
    from gmc.run.config import TrainConfig
    from gmc.settings import from_dict, to_dict
    from gmc.workflow import load_file

    sweep = load_file(PRESETS / "paper.yaml")  # as gmc plan-memory --preset reads it
    values = to_dict(sweep.run(sweep.largest_point()))
    values["model"] = PAPER["model"]  # the hub id's known shape, nothing fetched
    return plan(from_dict(TrainConfig, values), int(79.6 * GIB)).gradient_checkpointing


def test_smoke_preset_keeps_the_paper_settings():
    paper, smoke = flatten(PAPER), flatten(SMOKE)
    missing = sorted(k for k in paper if k not in smoke and not k.startswith("tiny_model."))
    assert not missing, f"paper.yaml settings absent from paper_smoke.yaml: {missing}"
    for key in KEPT:
        assert smoke[key] == paper[key], key
    # paper.yaml leaves checkpointing to the memory plan, which turns it on at 4B on an 80 GB card;
    # the smoke's toy activations always fit, so it turns it on itself: the path the paper runs
    assert paper["train.gradient_checkpointing"] == "auto" and smoke["train.gradient_checkpointing"] is True
    assert paper_plan_checkpoints()
    assert smoke["model"] == "random-qwen3" and smoke["train.engine"] == "hf"
    assert len(SMOKE["sweep"]["delay"]) > 1 and len(SMOKE["sweep"]["group_size"]) > 1
    assert set(SMOKE["evaluate"]["samples"]) == set(PAPER["evaluate"]["samples"]) and SMOKE["evaluate"]["limit"] >= 2


def test_smoke_preset_dry_run_plans_the_expected_jobs(tmp_path, snakemake):
    out = snakemake(["-n", "--cores", "2", "--configfile", str(PRESETS / "paper_smoke.yaml")], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    counts = {}
    for line in (out.stdout + out.stderr).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    sweep, latency = SMOKE["sweep"], SMOKE["latency"]
    runs = len(sweep["algorithm"]) * len(sweep["delay"]) * len(sweep["group_size"])
    runs += len(latency["algorithm"]) * len(latency["group_size"])
    # gmc at delay 0 trains no run of its own (tic's, one on-policy class), at every group size
    shared = len(SMOKE["sweep"]["group_size"])
    assert runs == 15 and counts["train"] == counts["evaluate"] == runs - shared and counts["share_run"] == shared
    for rule in (
        "build_random_model",
        "evaluate_base",
        "prepare_data",
        "mlflow_sync",
        "tables",
        "figures_from_results",
        "theory_lab",
    ):
        assert counts[rule] == 1, rule
    assert "fetch_model" not in counts and "build_tiny_model" not in counts


RESULTS = os.environ.get("GMC_PAPER_SMOKE_RESULTS")


needs_run = pytest.mark.skipif(not RESULTS, reason="set GMC_PAPER_SMOKE_RESULTS (make test-paper-smoke)")


def run_dirs() -> list[Path]:
    """The trained runs (a point that shares another's run holds only ``shared.json``)."""
    return sorted(
        d for d in Path(RESULTS, "train").glob("algo~*/delay~*/group~*/seed~*") if not (d / "shared.json").exists()
    )


@needs_run
def test_every_run_trained_the_paper_code_path():
    dirs = run_dirs()
    assert (
        len(dirs) == 13 and len(list(Path(RESULTS, "train").glob("algo~gmc/delay~0/group~*/seed~*/shared.json"))) == 2
    )
    # the budget splits every step: even the smallest step (fewest rows, the shortest MATH prompt
    # and one response token each) holds more padded tokens than one forward may take
    from transformers import AutoTokenizer

    from gmc.policy.logprobs import micro_batches
    from gmc.tasks.datasets import format_prompt, load_dataset

    budget = SMOKE["train"]["micro_batch_tokens"]
    tokenizer = AutoTokenizer.from_pretrained(Path(RESULTS, "models", "random-qwen3"))
    prompts = [format_prompt(tokenizer, r.problem, False) for r in load_dataset("math")]
    shortest = min(len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]) + 1
    rows = SMOKE["train"]["prompts_per_step"] * min(SMOKE["sweep"]["group_size"])
    assert len(micro_batches([shortest] * rows, budget)) > 1
    for d in dirs:
        cfg = yaml.safe_load((d / "config.yaml").read_text())  # the resolved TrainConfig
        assert cfg["model_dtype"] == "bfloat16" and cfg["master_weights"] is True, d
        assert cfg["gradient_checkpointing"] is True and cfg["micro_batch_tokens"] == budget, d
        assert cfg["optimizer"] == "adamw8bit" and cfg["train_data"] == "math" and cfg["thinking"] is False, d
        info = json.loads((d / "run.json").read_text())
        assert "bitsandbytes" in info["packages"], d
        metrics = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == list(range(SMOKE["train"]["steps"])), d
        for m in metrics:
            assert all(m[k] == m[k] for k in ("train/loss", "train/grad_norm")), (d, m["step"])  # not NaN
            # a latency step that refilled no slot generated nothing: no rollout metrics then
            assert m.get("rollout/response_length_max", 0) <= SMOKE["train"]["sampling"]["max_new_tokens"]
        assert any("rollout/response_length_max" in m for m in metrics), d
        staleness = [m["async/staleness_mean"] for m in metrics]
        delay = d.parent.parent.name.split("~")[1]
        if delay == "latency":
            assert max(staleness) > 0, d
        else:
            assert staleness == [float(delay)] * len(metrics), d
        assert json.loads((d / "summary.json").read_text())["steps"] == len(metrics)
    # float32 masters and the optimizer's moments in 8 bits in the checkpoint; the final model in
    # its compute dtype, bfloat16
    from safetensors.torch import load_file

    for d in dirs:
        state = torch.load(d / "checkpoint.pt", map_location="cpu", weights_only=False)
        assert {v.dtype for v in state["model"].values()} == {torch.float32}, d
        # bitsandbytes >= 0.50 saves its quantised states under one key per parameter
        states = [s.get("__bnb_optimizer_quant_state__", s) for s in state["optimizer"]["state"].values()]
        # (bitsandbytes keeps tensors under 4,096 elements, the norms, in 32 bits)
        moments = [s for s in states if "state1" in s and s["state1"].numel() >= 4096]
        assert moments and {s["state1"].dtype for s in moments} == {torch.uint8}, d
        assert {v.dtype for v in load_file(d / "model" / "model.safetensors").values()} == {torch.bfloat16}, d


@needs_run
def test_every_checkpoint_was_evaluated_on_every_benchmark():
    evals = [Path(RESULTS, "eval", d.relative_to(Path(RESULTS, "train"))) for d in run_dirs()]
    evals.append(Path(RESULTS, "eval", "base"))
    ev = SMOKE["evaluate"]
    for folder in evals:
        for name in ev["benchmarks"]:
            summary = json.loads((folder / f"{name}.json").read_text())
            assert summary["problems"] == ev["limit"] and summary["k"] == ev["samples"][name], (folder, name)
            assert 0 <= summary["pass_at_1"] <= 1 and 0 <= summary["greedy"] <= 1
            completions = (folder / f"{name}.completions.jsonl").read_text().splitlines()
            assert len(completions) == ev["limit"] * (1 + ev["samples"][name])
        cfg = json.loads((folder / "eval_config.json").read_text())
        assert cfg["model_dtype"] == "bfloat16" and cfg["thinking"] is False


@needs_run
def test_tables_figures_and_mlflow():
    main = pd.read_csv(Path(RESULTS, "tables", "main.csv"))
    assert set(main["algorithm"]) == {"base", *SMOKE["sweep"]["algorithm"]}
    for name in SMOKE["evaluate"]["benchmarks"]:
        assert any(c.startswith(f"eval/{name}/pass_at_1") for c in main.columns), name
    for t in ("main", "diagnostics"):
        assert Path(RESULTS, "tables", f"{t}.md").read_text().startswith("| algorithm")
        assert "\\begin{tabular}" in Path(RESULTS, "tables", f"{t}.tex").read_text()
    for name in FIGURES:
        assert Path(RESULTS, "figures", f"{name}.png").stat().st_size > 5000, name
        assert Path(RESULTS, "figures", f"{name}.pdf").exists(), name
    synced = json.loads(Path(RESULTS, "mlflow", "synced.json").read_text())
    # every sweep point has an MLflow run of its own: the 13 trained runs and the 2 that share a trained run
    assert len(synced["runs"]) == 15 and len(set(synced["runs"].values())) == 15
    import mlflow

    from gmc.run.tracking import SWEEP_TAG

    mlflow.set_tracking_uri(f"sqlite:///{Path(RESULTS, 'mlflow.db').resolve()}")
    stored = mlflow.search_runs(experiment_names=[SMOKE["experiment"]])
    parent = stored[f"tags.{SWEEP_TAG}"].notna() & stored["tags.mlflow.parentRunId"].isna()
    assert parent.sum() == 1  # the sweep's parent run; every training run nests under it
    stored = stored[~parent]
    assert set(stored["run_id"]) == set(synced["runs"].values())
    assert stored["tags.gmc.shared_with"].notna().sum() == 2
    assert set(stored["params.model_dtype"]) == {"bfloat16"}
