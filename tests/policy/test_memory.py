"""The memory plan: its parameter and saved-activation counts against what the model and autograd
report (random Qwen3 shapes on CPU), the paper preset on an 80 GB card in its three phases with
the allocator's reserve, checkpointing chosen by the plan, a run that refuses to start when its
plan does not fit, and an out-of-memory error reported beside the plan."""

import pytest
import torch

from gmc.policy.build import qwen3_model
from gmc.policy.logprobs import Rows, micro_batch_logprobs, precision
from gmc.policy.memory import (
    ALLOCATOR_RESERVE,
    GIB,
    PHASES,
    MemoryPlanError,
    ModelShape,
    _plan,
    checkpoint_host_bytes,
    plan,
)
from gmc.run.config import load_train_config
from gmc.run.random_model import QWEN3_VOCAB_ROWS, RandomModelConfig

SHAPES = [
    RandomModelConfig(),
    RandomModelConfig(hidden_size=96, intermediate_size=160, num_layers=3, num_heads=6, num_kv_heads=2),
]


def shape_of(cfg: RandomModelConfig, tied: bool = True) -> ModelShape:
    return ModelShape(
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_layers,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.hidden_size // cfg.num_heads,
        QWEN3_VOCAB_ROWS,
        tied,
    )


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=["random-qwen3", "wider"])
def test_the_plans_parameter_count_is_the_models(shape, tied):
    model = qwen3_model(shape, QWEN3_VOCAB_ROWS, tie_word_embeddings=tied)
    assert shape_of(shape, tied).parameters == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=["random-qwen3", "wider"])
def test_the_plans_checkpointed_activations_are_what_autograd_saves(shape, dtype):
    """One micro-batch through the update's own forward with gradient checkpointing: the bytes
    autograd keeps from the decoder (the LM head is chunked and checkpointed apart) are exactly
    the plan's ``saved activations`` per token."""
    model = qwen3_model(shape, 1000).train()
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    rows = Rows([torch.randint(0, 1000, (n,)) for n in (40, 44, 48)], [8, 8, 8], [32, 36, 40])
    saved: dict[int, int] = {}

    def pack(t):
        if not isinstance(t, torch.nn.Parameter):
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    decoder = model.get_decoder()
    ids = torch.stack([torch.nn.functional.pad(s, (0, 48 - len(s))) for s in rows.sequences])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), precision(model, dtype):
        _ = decoder(input_ids=ids).last_hidden_state
    tokens = ids.numel()
    assert sum(saved.values()) == tokens * shape_of(shape).saved_per_token(shape.num_layers)
    with precision(model, dtype):  # the update's forward runs on the same shapes
        assert micro_batch_logprobs(model, rows, [2, 1, 0], 0, 1.0, 64).shape == (3, 40)  # longest first


def paper(*overrides):
    return load_train_config(
        None,
        [
            "model=Qwen/Qwen3-4B",
            "model_dtype=bfloat16",
            "gradient_checkpointing=true",
            "optimizer=adamw8bit",
            "engine=vllm",
            "micro_batch_tokens=16384",
            "logprob_chunk_size=1024",
            "sampling.max_new_tokens=4096",
            "prompts_per_step=32",
            "group_size=32",
            *overrides,
        ],
    )


def test_the_paper_settings_fit_an_80_gb_card_with_vllm_asleep():
    card = int(79.6 * GIB)
    asleep = plan(paper("vllm.sleep=true", "vllm.gpu_memory_utilization=0.45"), card)
    assert asleep.fits and 50 * GIB < asleep.training < 62 * GIB and asleep.generation < 64 * GIB
    awake = plan(paper(), card)  # vLLM's default share, awake while the trainer holds the GPU
    assert not awake.fits and "vllm.sleep: true" in awake.advice()
    # 4.0 B parameters: float32 masters and gradients, 8-bit moments, bfloat16 copies
    assert asleep.items["parameters"][0] == asleep.items["gradients"][0] == 4 * 4_022_468_096


def test_the_behaviour_pass_and_the_lm_heads_weight_gradient_are_planned():
    """By hand at 4B, 16,384 tokens, chunks of 1,024, bfloat16 over float32 masters: the
    behaviour pass (generation phase) holds one layer's no-grad transients (12 H + 4 q + 4 kv + 6 I
    bytes a token, above the chunk's 8 bytes a logit) and the LM head's weight in bfloat16;
    training's LM head adds its weight gradient in bfloat16 and float32 to the chunk's logits."""
    H, q, kv, inter, V = 2560, 32 * 128, 8 * 128, 9728, 151936
    p = plan(paper("vllm.sleep=true", "vllm.gpu_memory_utilization=0.45"), int(79.6 * GIB))
    assert p.items["behaviour pass"] == (0, 16384 * (12 * H + 4 * q + 4 * kv + 6 * inter) + V * H * 2, 0)
    assert p.items["LM-head chunk or recomputed layer"] == (1024 * V * 12 + V * H * 6, 0, 0)
    assert p.peak_phase == "generation"
    sampler = plan(
        paper(
            "vllm.sleep=true",
            "vllm.gpu_memory_utilization=0.45",
            "behaviour_logprobs=sampler",
            "sampling.temperature=1",
        ),
        int(79.6 * GIB),
    )
    assert sampler.items["behaviour pass"] == (0, 0, 0)  # the engine's log-probs: no pass beside vLLM
    in_place = plan(paper("master_weights=false"), None)  # bfloat16 weights: nothing to cast, no float32 copy
    assert in_place.items["behaviour pass"][1] == 16384 * (12 * H + 4 * q + 4 * kv + 6 * inter)
    recomputed = 16384 * (20 * H + 10 * q + 8 * kv + 8 * inter)  # larger than the head without its weight gradient
    assert in_place.items["LM-head chunk or recomputed layer"][0] == max(1024 * V * 12, recomputed) == recomputed


def test_bfloat16_live_weights_with_optimizer_masters_are_planned_by_hand():
    """``master_weights: optimizer`` at 4B: bfloat16 parameters and gradients (2 B each), float32
    masters (4 B) resident in every phase, 8-bit moments, no autocast copies and no weight cast in
    the behaviour pass; the checkpoint holds both weights."""
    P, H, q, kv, inter = 4_022_468_096, 2560, 32 * 128, 8 * 128, 9728
    p = plan(paper("vllm.sleep=true", "vllm.gpu_memory_utilization=0.45", "master_weights=optimizer"), None)
    assert p.items["parameters"] == (2 * P,) * 3 and p.items["float32 masters"] == (4 * P,) * 3
    assert p.items["gradients"] == (2 * P, 0, 0) and p.items["optimizer states"] == (2 * P,) * 3
    assert p.items["autocast weight copies"] == (0, 0, 0)
    assert p.items["behaviour pass"][1] == 16384 * (12 * H + 4 * q + 4 * kv + 6 * inter)
    adamw = plan(paper("master_weights=optimizer", "optimizer=adamw"), None)
    assert adamw.items["optimizer states"][0] == 2 * 4 * P  # float32 moments of the masters
    assert checkpoint_host_bytes(paper("master_weights=optimizer")) == 2 * P + 4 * P + 2 * P


def test_the_plan_has_the_resume_phase_and_the_allocators_reserve():
    """A resume holds what generation holds but its behaviour pass (vLLM awake as built,
    weights and optimizer states loaded; the checkpoint itself in host memory); every phase
    reserves a share of what PyTorch holds for the caching allocator."""
    p = plan(paper("vllm.sleep=true", "vllm.gpu_memory_utilization=0.45"), int(79.6 * GIB))
    assert all(len(b) == len(PHASES) for b in p.items.values())
    same = [name for name in p.items if name not in ("behaviour pass", "allocator reserve")]
    assert [p.items[n][2] for n in same] == [p.items[n][1] for n in same] and p.resume < p.generation
    assert p.items["vLLM"][2] == p.items["vLLM"][1] > 30 * GIB
    torch_held = [
        sum(b[k] for name, b in p.items.items() if name not in ("allocator reserve", "vLLM", "CUDA runtime"))
        for k in range(3)
    ]
    assert p.items["allocator reserve"] == tuple(int(ALLOCATOR_RESERVE * h) for h in torch_held)
    assert 3 * GIB < p.items["allocator reserve"][0] < 5 * GIB
    host = checkpoint_host_bytes(paper("delay.d=128"))
    assert host == 4 * 4_022_468_096 + 2 * 4_022_468_096 + 128 * 32 * 32 * 4096 * 17


def test_checkpointing_is_chosen_by_the_plan():
    """``gradient_checkpointing: auto``: no layer checkpointed where the update's activations fit,
    and otherwise the fewest with which the plan leaves 5% of the device free; each layer it does
    not checkpoint keeps the per-layer set (by hand) instead of its float32 input."""
    card = int(79.6 * GIB)
    big = plan(paper("gradient_checkpointing=auto", "vllm.sleep=true", "vllm.gpu_memory_utilization=0.45"), card)
    assert 0 < big.checkpointed_layers < 36 and big.peak <= 0.95 * card
    one_fewer = _plan(
        paper("vllm.sleep=true", "vllm.gpu_memory_utilization=0.45"),
        card,
        ModelShape.of("Qwen/Qwen3-4B"),
        big.checkpointed_layers - 1,
    )
    assert one_fewer.peak > 0.95 * card
    every = plan(paper("vllm.sleep=true", "vllm.gpu_memory_utilization=0.45"), card)  # gradient_checkpointing: true
    assert every.checkpointed_layers == 36 and every.gradient_checkpointing
    H, q, kv, inter = 2560, 32 * 128, 8 * 128, 9728
    per_layer = 20 * H + 10 * q + 8 * kv + 8 * inter
    assert big.items["saved activations"][0] - every.items["saved activations"][0] == 16384 * (
        36 - big.checkpointed_layers
    ) * (per_layer - 4 * H)
    small = plan(paper("gradient_checkpointing=auto", "micro_batch_tokens=512"), 400 * GIB)
    assert small.checkpointed_layers == 0 and not small.gradient_checkpointing and small.fits
    assert (
        small.items["saved activations"][0]
        > plan(paper("micro_batch_tokens=512"), 400 * GIB).items["saved activations"][0]
    )
    assert plan(paper("gradient_checkpointing=auto"), None).checkpointed_layers == 0  # no limit: it fits


def test_a_partly_checkpointed_model_gives_the_same_gradient():
    """The first two of four layers checkpointed: the same loss and gradient as with none or all
    (a checkpointed layer runs its forward again in the backward; its arithmetic is the same)."""
    from gmc.policy.model import checkpoint_layers

    ids = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(0))
    grads = []
    for count in (0, 2, None):
        torch.manual_seed(0)
        model = qwen3_model(RandomModelConfig(num_layers=4), 1000).train()
        checkpoint_layers(model, count)
        flags = [layer.gradient_checkpointing for layer in model.get_decoder().layers]
        assert flags == {0: [False] * 4, 2: [True, True, False, False], None: [True] * 4}[count]
        model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_an_out_of_memory_error_names_the_plan_beside_the_measured_peak(tmp_path, small_config):
    from gmc.run.trainer import Trainer

    trainer = Trainer(small_config(memory_limit_gib=64), tmp_path / "run", progress=False)
    assert trainer.memory_plan is not None and trainer.memory_plan.fits

    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    trainer.update.backward = exhausted
    with pytest.raises(
        MemoryPlanError,
        match=r"(?s)out of memory in training; measured: .*planned: .* GiB for "
        r"training of 64.00 GiB\nitem .*saved activations.*Tried to allocate",
    ):
        trainer.run()
    assert not (tmp_path / "run" / "summary.json").exists()


def test_a_run_whose_plan_does_not_fit_stops_before_the_model_loads(tmp_path, small_config, monkeypatch):
    from gmc.run import trainer

    monkeypatch.setattr(trainer, "load_policy", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(
        MemoryPlanError,
        match=r"needs .* GiB, more than the device's 0\.001 GiB; largest items: "
        r"saved activations .*\(micro_batch_tokens, gradient_checkpointing",
    ):
        trainer.Trainer(small_config(memory_limit_gib=0.001), tmp_path / "run", progress=False)


def test_plan_memory_command(capsys, tiny_model_dir):
    from gmc.cli import main

    assert main(["plan-memory", "--preset", "workflow/presets/paper.yaml", "--gpu-gib", "79.6"]) == 0
    out = capsys.readouterr().out
    assert "Qwen/Qwen3-4B" in out and "fits (peak" in out and "saved activations" in out
    assert "resume" in out and "allocator reserve" in out and "GiB of host memory" in out
    assert main(["plan-memory", "--set", f"model={tiny_model_dir}", "--gpu-gib", "0.001"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
