"""gmc's estimators as the loss of TRL's GRPOTrainer (gmc.integrations.trl): a few steps of the tiny
model on stale samples; on a fixed batch, through TRL's own shuffling, splitting and gradient
accumulation, the loss and gradient of gmc's own update; on-policy, TRL's own loss of the same
aggregation; and every refusal, naming its key. Skipped without TRL (make test-peers installs it)."""

import importlib.util
import math
import re
import sys

import pytest
import torch

pytest.importorskip("trl", reason='TRL is not installed (pip install "gmc[trl]"; make test-peers installs it)')

from datasets import Dataset  # noqa: E402
from helpers import REPO  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from gmc.estimators import REGISTRY  # noqa: E402
from gmc.estimators.correction import RolloutCorrection  # noqa: E402
from gmc.integrations.trl import GMCGRPOConfig, GMCGRPOTrainer  # noqa: E402
from gmc.policy.update import Update  # noqa: E402
from gmc.rollouts.groups import Group  # noqa: E402
from gmc.settings import ConfigError  # noqa: E402
from gmc.tasks.datasets import PLAIN_TEMPLATE  # noqa: E402
from gmc.tasks.synthetic import SyntheticTask  # noqa: E402

G = 4
MAX_NEW = 12
COMMON = dict(
    use_cpu=True,
    bf16=False,  # TRL's default autocasts to bfloat16, on a CPU too; gmc's update computes in float32 here
    report_to=[],
    save_strategy="no",
    logging_steps=1,
    disable_dropout=True,
    seed=0,
    top_k=0,
    num_generations=G,
    max_completion_length=MAX_NEW,
    per_device_train_batch_size=2 * G,
)


def gmc_config(tmp_path, **settings) -> GMCGRPOConfig:
    return GMCGRPOConfig(output_dir=str(tmp_path), **{**COMMON, **settings})


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.padding_side = "left"
    return tok


def length_reward(completions, **_):
    return [len(c) / 10 for c in completions]


def column_reward(completions, reward, **_):
    return list(reward)


# ---------------------------------------------------------------------------------------------
# (a) training on stale samples


@pytest.mark.parametrize("algorithm", ["gmc", "tic", "cispo"])
def test_trains_the_tiny_model_on_stale_samples(algorithm, tiny_model_dir, tokenizer, tmp_path):
    """Three steps from one generation (steps_per_generation=3): the first trains on the policy
    that sampled, the later two on samples an update or two old, whose log-ratio is nonzero."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = [p.detach().clone() for p in model.parameters()]
    records = SyntheticTask().generate("train", 6, seed=0)
    data = Dataset.from_list([{"prompt": PLAIN_TEMPLATE.format(problem=r.problem)} for r in records])
    args = gmc_config(tmp_path, algorithm=algorithm, steps_per_generation=3, max_steps=3, learning_rate=3e-4)
    trainer = GMCGRPOTrainer(model, length_reward, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "ratio/log_ratio_mean" in h]
    assert trainer.state.global_step == 3 and len(logs) == 3
    assert abs(logs[0]["ratio/log_ratio_mean"]) < 1e-6
    assert all(abs(h["ratio/log_ratio_mean"]) > 1e-4 and h["ratio/approx_kl"] > 0 for h in logs[1:])
    assert all(math.isfinite(h["loss"]) and set(REGISTRY[algorithm].diagnostics) <= h.keys() for h in logs)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_evaluation_reports_the_estimators_loss(tiny_model_dir, tokenizer, tmp_path):
    """TRL's evaluation generates whole groups and computes the estimator's loss, on-policy."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    data = Dataset.from_list([{"prompt": f"{i} + {i} ="} for i in range(4)])
    args = gmc_config(tmp_path, per_device_eval_batch_size=2 * G)
    trainer = GMCGRPOTrainer(model, length_reward, args=args, train_dataset=data, processing_class=tokenizer)
    metrics = trainer.evaluate(data)
    assert math.isfinite(metrics["eval_loss"])
    assert metrics["eval_ratio/log_ratio_mean"] == 0 and "eval_ratio/frac_groups_capped" in metrics


def test_the_worked_example_of_the_docs_runs(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """docs/integrations.md's example, as written but for the model's folder."""
    page = (REPO / "docs" / "integrations.md").read_text()
    example = re.findall(r"```python\n(.*?)```", page.split("### A worked example")[1], re.S)[0]
    written = 'model_dir = "results/models/tiny/seed~0"'
    assert written in example
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(example.replace(written, f"model_dir = {str(tiny_model_dir)!r}"), scope)
    assert scope["trainer"].state.global_step == 3
    printed = [[float(x) for x in line.split()] for line in capsys.readouterr().out.splitlines()[-3:]]
    assert printed[0][0] == pytest.approx(0, abs=1e-6) and printed[2][0] != 0


# ---------------------------------------------------------------------------------------------
# a fixed batch, generated by a stand-in for TRL's generation


def fixed_batch(vocab: int, prompts: int, seed: int = 0):
    """``prompts`` groups of ``G`` completions of 3..12 tokens (prompts of one length: TRL pads
    prompts on the left, gmc does not), and their rewards."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for b in range(prompts):
        prompt = torch.randint(2, vocab, (5,), generator=g).tolist()
        lengths = torch.randint(3, MAX_NEW + 1, (G,), generator=g).tolist()
        completions = [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lengths]
        rewards = torch.rand(G, generator=g).tolist()
        out.append((b, prompt, completions, rewards))
    return out


def stand_in_generation(trainer, batch, sampler=None):
    """Make ``trainer._generate`` return ``batch`` (and the sampler's log-probs ``sampler``, one
    ``[G, T]`` tensor a group) in TRL's layout; returns the rows TRL's sampler would hand it."""
    prompt_ids = [p for _, p, completions, _ in batch for _ in completions]
    completion_ids = [c for _, _, completions, _ in batch for c in completions]
    logps = None
    if sampler is not None:
        logps = [s[i, : len(c)].tolist() for s, (_, _, cs, _) in zip(sampler, batch) for i, c in enumerate(cs)]
    text = trainer.processing_class.batch_decode(completion_ids)
    trainer._generate = lambda prompts: (prompt_ids, completion_ids, None, text, logps, {}, None, [])
    return [{"prompt": f"prompt {b}", "reward": r} for b, _, _, rewards in batch for r in rewards]


def groups_of(batch, pad_id: int) -> list[Group]:
    groups = []
    for b, prompt, completions, rewards in batch:
        ids = torch.full((G, MAX_NEW), pad_id)
        for i, c in enumerate(completions):
            ids[i, : len(c)] = torch.tensor(c)
        mask = torch.arange(MAX_NEW) < torch.tensor([len(c) for c in completions]).unsqueeze(1)
        groups.append(
            Group(b, torch.tensor(prompt), ids, mask, torch.tensor(rewards), None, torch.zeros(G, MAX_NEW), 0)
        )
    return groups


def perturb(model, seed: int = 1, scale: float = 0.02) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


CASES = {
    "gmc": dict(algorithm="gmc"),
    "tic, two micro-batches": dict(algorithm="tic", accumulation=2),
    "cispo (token_mean), two micro-batches": dict(algorithm="cispo", accumulation=2),
    "gmc, sampler behaviour": dict(algorithm="gmc", sampler=True),
    "kpop, sampler behaviour, proximal": dict(algorithm="kpop", sampler=True),
    "tic, decoupled correction": dict(algorithm="tic", sampler=True, preset="decoupled_seq_is_rs"),
    "grpo, bypass correction": dict(algorithm="grpo", sampler=True, preset="bypass_pg_token_icepop"),
    # rejection in bypass mode under token_mean: every weight carries the share of tokens kept; the
    # preset's band moved to where it keeps some responses, not all (the perturbed policy's mean
    # log-prob is 2 to 6 nats above the stand-in sampler's: k1 between -6 and -2)
    "cispo (token_mean), bypass correction with rejection": dict(
        algorithm="cispo", sampler=True, preset="bypass_ppo_clip_geo_rs", correction={"rollout_rs_threshold": "0.02_1"}
    ),
    # TRL's own correction (vllm_importance_sampling_mode="sequence_mask" between 0.5 and 3) is gmc's
    # decoupled sequence weight zeroed outside that band
    "tic, TRL's vLLM correction": dict(
        algorithm="tic",
        sampler=True,
        trl_correction=True,
        reference={"rollout_is": "sequence", "rollout_is_threshold": "0.5_3.0"},
    ),
    "gmc, KL to the reference": dict(algorithm="gmc", estimator={"kl_coef": 0.05}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fixed_batch_equals_gmcs_update(case, tiny_model_dir, tokenizer, tmp_path):
    """The trainer's micro-batches, through TRL's generation buffer, shuffle, split and
    accumulation, give the loss and gradient of gmc's own update on the whole batch (the
    estimator's loss of its registry entry, gmc's advantages and mismatch correction), with
    stale samples: the policy moved after TRL scored the batch."""
    spec = CASES[case]
    algorithm, accumulation, preset = spec["algorithm"], spec.get("accumulation", 1), spec.get("preset")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    args = gmc_config(
        tmp_path,
        algorithm=algorithm,
        estimator=spec.get("estimator", {}),
        gradient_accumulation_steps=accumulation,
        num_iterations=2,  # TRL computes the policy's log-probs at generation (old_per_token_logps)
    )
    trainer = GMCGRPOTrainer(model, column_reward, args=args, train_dataset=Dataset.from_list([{"prompt": "x"}]))
    correction = None if preset is None else RolloutCorrection(preset=preset, **spec.get("correction", {})).resolved()
    trainer.gmc_correction = correction  # the config refuses a correction without vLLM, which keeps the sampler's
    if spec.get("trl_correction"):  # what use_vllm would set; the stand-in generation replaces vLLM's
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
        trainer.vllm_importance_sampling_clip_min = 0.5
        correction = RolloutCorrection(**spec["reference"]).resolved()
    trainer.current_gradient_accumulation_steps = accumulation
    model.train()

    batch = fixed_batch(model.config.vocab_size, 2 * accumulation)
    groups = groups_of(batch, tokenizer.pad_token_id)
    est = REGISTRY[algorithm]
    from_sampler = spec.get("sampler", False) and (correction is None or correction["bypass_mode"])
    update = Update(
        model,
        est.loss_function(),
        est.resolved(args.estimator_config),
        0,
        tokenizer.pad_token_id,
        max_new_tokens=MAX_NEW,
        reference=AutoModelForCausalLM.from_pretrained(tiny_model_dir) if args.estimator_config.kl_coef else None,
        correction=correction,
        sampler_behaviour=from_sampler,
    )
    generating = update.group_logprobs(groups)
    sampler = None
    if spec.get("sampler"):
        g = torch.Generator().manual_seed(2)
        sampler = [lp + 0.3 * torch.randn(lp.shape, generator=g) for lp in generating]
    rows = stand_in_generation(trainer, batch, sampler)

    total = torch.tensor(0.0)
    seen = []
    for step in range(accumulation):
        trainer._step = step
        inputs = trainer._prepare_inputs(rows)
        if step == 0:
            perturb(model)
        assert inputs["advantages"].shape == (2, G)
        for prompt, completions in zip(inputs["prompt_ids"], inputs["completion_ids"]):
            assert (prompt == prompt[0]).all()  # one prompt a group
            b = next(b for b, p, _, _ in batch if p == prompt[0].tolist())
            assert sorted(c[c != tokenizer.pad_token_id].tolist() for c in completions) == sorted(batch[b][2])
            seen.append(b)
        loss = trainer._compute_loss(model, inputs)  # as TRL's training step: each micro-batch's backward
        loss.backward()
        total += loss.detach()
    assert sorted(seen) == list(range(len(batch)))
    ours = grads(model)
    model.zero_grad()

    for group, lp, s in zip(groups, generating, sampler or generating):
        group.sampler_logp = s
        group.behaviour_logp = s if from_sampler else lp
    proximal = generating if est.proximal else None
    loss, stats, _ = update.backward(groups, on_policy=False, proximal=proximal)
    reference = grads(model)
    torch.testing.assert_close(total, loss, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-6 * float(reference.abs().max()))
    assert abs(stats["ratio/log_ratio_mean"]) > 1e-3
    assert trainer._metrics["train"]["ratio/log_ratio_mean"]
    if correction is not None and correction["rollout_rs"]:
        assert 0 < stats["rollout_corr/rollout_rs_masked_fraction"] < 1


# ---------------------------------------------------------------------------------------------
# (c) on-policy, TRL's own loss


@pytest.mark.parametrize(
    "aggregation, loss_type", [("seq_mean", "grpo"), ("token_mean", "bnpo"), ("seq_sum_const", "dr_grpo")]
)
def test_on_policy_equals_trls_loss(aggregation, loss_type, tiny_model_dir, tmp_path):
    """On-policy, grpo under each aggregation is TRL's GRPO loss of that normalisation (TRL's
    ``grpo``: per sequence, then over sequences; ``bnpo``: over the batch's tokens; ``dr_grpo``:
    over the sequences times the token limit), given the same advantages."""
    data = Dataset.from_list([{"prompt": "x"}])
    ours_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trl_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    args = gmc_config(tmp_path / "ours", algorithm="grpo", estimator={"aggregation": aggregation})
    ours = GMCGRPOTrainer(ours_model, column_reward, args=args, train_dataset=data)
    trl_args = GRPOConfig(output_dir=str(tmp_path / "trl"), loss_type=loss_type, **COMMON)
    theirs = GRPOTrainer(trl_model, column_reward, args=trl_args, train_dataset=data)
    batch = fixed_batch(ours_model.config.vocab_size, 2)
    for trainer in (ours, theirs):
        trainer.current_gradient_accumulation_steps = 1
        trainer.model.train()

    trl_inputs = theirs._generate_and_score_completions(stand_in_generation(theirs, batch))
    assert "old_per_token_logps" not in trl_inputs  # on-policy: TRL computes no old policy
    trl_loss = theirs._compute_loss(trl_model, trl_inputs)
    trl_loss.backward()
    inputs = ours._generate_and_score_completions(stand_in_generation(ours, batch))
    inputs["advantages"] = trl_inputs["advantages"].view(-1, G)  # TRL's advantages (its std is Bessel's, +1e-4)
    loss = ours._compute_loss(ours_model, inputs)
    loss.backward()
    torch.testing.assert_close(loss, trl_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grads(ours_model), grads(trl_model), rtol=1e-4, atol=1e-7)
    assert grads(ours_model).abs().max() > 0


# ---------------------------------------------------------------------------------------------
# (d) refusals


@pytest.mark.parametrize(
    "settings, key",
    [
        (dict(algorithm="gmcc"), "algorithm"),
        (dict(estimator={"epz": 0.2}), "estimator.epz"),
        (dict(estimator={"eps": -1.0}), "estimator.eps"),
        (dict(rollout_correction={"rollout_is": "tokens"}), "rollout_correction.rollout_is"),
        (dict(loss_type="grpo"), "loss_type"),
        (dict(epsilon_high=0.28), "epsilon_high"),
        (dict(beta=0.04), "beta"),
        (dict(scale_rewards="none"), "scale_rewards"),
        (dict(off_policy_mask_threshold=0.5), "off_policy_mask_threshold"),
        (dict(per_device_train_batch_size=6, steps_per_generation=2), "per_device_train_batch_size"),
        (dict(algorithm="m2po", gradient_accumulation_steps=2), "gradient_accumulation_steps"),
        (
            dict(algorithm="icepop", estimator={"mask_denominator": "kept"}, gradient_accumulation_steps=2),
            "gradient_accumulation_steps",
        ),
        (dict(algorithm="cispo", gradient_accumulation_steps=2, steps_per_generation=3), "steps_per_generation"),
        (dict(rollout_correction={"preset": "decoupled_token_is"}), "rollout_correction"),
        (dict(rollout_correction={"preset": "bypass_ppo_clip"}, use_vllm=True), "vllm_importance_sampling_correction"),
        # vLLM's log-probs under a sampling that TRL's training forward does not apply: as the
        # behaviour, in rollout_correction, or in TRL's own correction
        (dict(use_vllm=True, vllm_importance_sampling_correction=False, top_p=0.9), "top_p"),
        (dict(use_vllm=True, top_k=20), "top_k"),
        (
            dict(
                use_vllm=True,
                vllm_importance_sampling_correction=False,
                rollout_correction={"preset": "decoupled_token_is"},
                min_p=0.05,
            ),
            "min_p",
        ),
        (dict(use_vllm=True, repetition_penalty=1.1), "repetition_penalty"),
        (dict(use_vllm=True, generation_kwargs={"presence_penalty": 0.5}), "generation_kwargs.presence_penalty"),
        (
            dict(
                algorithm="cispo",
                rollout_correction={"preset": "decoupled_k3_rs"},
                use_vllm=True,
                vllm_importance_sampling_correction=False,
                gradient_accumulation_steps=2,
            ),
            "gradient_accumulation_steps",
        ),
    ],
)
def test_refusals_name_the_key(settings, key, tmp_path):
    with pytest.raises(ConfigError) as e:
        gmc_config(tmp_path, **settings)
    assert e.value.key == key and str(e.value).startswith(f"{key}: ") and "\n" not in str(e.value)


def import_fresh(monkeypatch) -> None:
    """gmc.integrations.trl executed afresh under another name (the one imported stays)."""
    spec = importlib.util.spec_from_file_location("gmc_trl_probe", REPO / "gmc" / "integrations" / "trl.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)


@pytest.mark.parametrize("version", ["1.15.2", "1.17.0", "2.16.0"])
def test_another_trl_minor_fails_at_import(version, monkeypatch):
    import trl

    monkeypatch.setattr(trl, "__version__", version)
    with pytest.raises(ImportError) as e:
        import_fresh(monkeypatch)
    assert f"refuses trl {version}" in str(e.value) and "trl>=1.16,<1.17" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setattr(trl, "__version__", "1.16.3")
    import_fresh(monkeypatch)


def test_missing_trl_fails_at_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)
    with pytest.raises(ImportError, match=r'pip install "gmc\[trl\]"'):
        import_fresh(monkeypatch)


def test_more_than_one_process_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(GMCGRPOConfig, "world_size", property(lambda self: 2))
    with pytest.raises(ConfigError) as e:
        gmc_config(tmp_path)
    assert e.value.key == "world_size"


def test_accepted_settings(tmp_path):
    """What the refusals leave: gmc's and TIC's group-local weights and seq_* aggregations under
    any accumulation, a correction with vLLM's log-probs and TRL's own correction off, vLLM at
    any temperature, truncated sampling without vLLM."""
    args = gmc_config(
        tmp_path,
        algorithm="gmc",
        gradient_accumulation_steps=4,
        steps_per_generation=2,
        estimator={"eps": 0.1, "kl_coef": 0.01},
        rollout_correction={"preset": "decoupled_geo_rs", "record_logprobs": False},
        use_vllm=True,
        vllm_importance_sampling_correction=False,
        temperature=0.7,  # TRL's training forward divides by it, vLLM's processed log-probs are after it
    )
    assert args.estimator_config.eps == 0.1 and args.estimator_config.aggregation == "seq_sum_const"
    assert gmc_config(tmp_path, top_p=0.9, top_k=20).top_p == 0.9  # without vLLM no sampler log-probs enter the loss
    assert args.beta == 0.01  # TRL computes the reference log-probs of gmc's KL term
    assert args.rollout_correction_config.resolved()["rollout_rs"] == "seq_mean_k1"


def test_trainer_refusals(tiny_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    data = Dataset.from_list([{"prompt": "x"}])
    plain = GRPOConfig(output_dir=str(tmp_path), **COMMON)
    with pytest.raises(TypeError, match="GMCGRPOConfig"):
        GMCGRPOTrainer(model, column_reward, args=plain, train_dataset=data)
    unscorable = lambda completions, **_: [None] * len(completions)  # noqa: E731
    trainer = GMCGRPOTrainer(model, unscorable, args=gmc_config(tmp_path), train_dataset=data)
    model.train()
    rows = stand_in_generation(trainer, fixed_batch(model.config.vocab_size, 2))
    with pytest.raises(ValueError, match="reward_funcs"):
        trainer._generate_and_score_completions(rows)
