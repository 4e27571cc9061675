"""The random Qwen3-architecture model: shape, vocabulary rows, chat template and end ids."""

import json

import pytest
import torch

from gmc.run.random_model import QWEN3_VOCAB_ROWS


@pytest.fixture(scope="module")
def random_model_dir(tmp_path_factory, shared_data):
    """Built once through the command line, at a smaller shape than the preset's."""
    from gmc.cli import main

    out = tmp_path_factory.mktemp("models") / "random-qwen3"
    main(
        [
            "build-random-model",
            "--out",
            str(out),
            "--set",
            "hidden_size=32",
            "--set",
            "intermediate_size=96",
            "--set",
            "num_layers=1",
            "--set",
            "seed=3",
            "--data-root",
            str(shared_data),
        ]
    )
    return out


@pytest.fixture(scope="module")
def random_policy(random_model_dir):
    from gmc.policy.model import load_policy

    return load_policy(str(random_model_dir), "bfloat16", "cpu", gradient_checkpointing=True)


def test_shape_and_vocabulary_rows(random_model_dir, random_policy):
    model, tokenizer = random_policy
    cfg = model.config
    assert (cfg.model_type, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == ("qwen3", 32, 96, 1)
    assert cfg.head_dim * cfg.num_attention_heads == 32 and cfg.num_attention_heads % cfg.num_key_value_heads == 0
    emb = model.get_input_embeddings().weight
    assert emb.shape == (QWEN3_VOCAB_ROWS, 32) == (151_936, 32)
    assert model.get_output_embeddings().weight.data_ptr() == emb.data_ptr()  # tied, as in Qwen3-4B
    assert emb.dtype == torch.bfloat16
    assert json.loads((random_model_dir / "config.json").read_text())["dtype"] == "bfloat16"
    # more rows than tokenizer entries, as in Qwen3 (151,936 rows, 151,669 entries)
    assert 1000 < len(tokenizer) < QWEN3_VOCAB_ROWS
    ids = torch.tensor([tokenizer("What is $1+1$?")["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], QWEN3_VOCAB_ROWS) and torch.isfinite(logits).all()


def test_build_is_seeded(random_model_dir, shared_data, tmp_path):
    from safetensors.torch import load_file

    from gmc.run.random_model import RandomModelConfig, build_random_qwen3

    build_random_qwen3(
        tmp_path / "again",
        RandomModelConfig(hidden_size=32, intermediate_size=96, num_layers=1, seed=3),
        data_root=str(shared_data),
    )
    a, b = load_file(random_model_dir / "model.safetensors"), load_file(tmp_path / "again" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (random_model_dir / "tokenizer.json").read_text() == (tmp_path / "again" / "tokenizer.json").read_text()


def test_end_ids_are_qwen3s(random_model_dir, random_policy):
    model, tokenizer = random_policy
    im_end, end_of_text = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == im_end
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == end_of_text
    assert model.generation_config.eos_token_id == [im_end, end_of_text]
    assert json.loads((random_model_dir / "generation_config.json").read_text())["eos_token_id"] == [
        im_end,
        end_of_text,
    ]
    assert model.config.eos_token_id == im_end and model.config.pad_token_id == end_of_text
    assert tokenizer.padding_side == "left"


def test_the_hf_engine_stops_at_both_end_ids(random_policy):
    from gmc.rollouts.hf_engine import HFEngine

    model, tokenizer = random_policy
    assert HFEngine(model, tokenizer).eos_ids == set(tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))


@pytest.mark.parametrize("thinking", [False, True])
def test_chat_template_honours_thinking(random_policy, thinking):
    from gmc.tasks.datasets import INSTRUCTION, format_prompt

    _, tokenizer = random_policy
    prompt = format_prompt(tokenizer, "Compute $2+3$.", thinking=thinking)
    turn = f"<|im_start|>user\nCompute $2+3$.\n{INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    assert prompt == turn + ("" if thinking else "<think>\n\n</think>\n\n")
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    tags = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<think>", "</think>"])
    assert ids.count(tags[0]) == 2 and ids.count(tags[1]) == 1  # each tag is one token
    assert ids.count(tags[2]) == ids.count(tags[3]) == (0 if thinking else 1)
    # turn delimiters are special (dropped from decoded answers); the think tags stay, as in Qwen3
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert "<|im_start|>" not in text and "<|im_end|>" not in text
    assert ("<think>" in text) is (not thinking)


def test_rows_past_the_tokenizer_decode_to_nothing(random_policy):
    _, tokenizer = random_policy
    word = tokenizer("boxed", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(word + [QWEN3_VOCAB_ROWS - 1, len(tokenizer) + 5]) == "boxed"


def test_bad_shape_is_rejected():
    from gmc.run.random_model import RandomModelConfig

    with pytest.raises(ValueError, match="num_heads"):
        RandomModelConfig(hidden_size=30, num_heads=4)
