"""Building Qwen3-architecture models locally, without a download: the one path of the tiny CPU
policy (:mod:`gmc.run.tiny_model`) and of the random-init stand-in for Qwen3 (:mod:`gmc.run.random_model`).

A byte-level BPE tokenizer is trained on the texts the model will see (digits split, left
padding), a ``Qwen3ForCausalLM`` of a :class:`Qwen3Shape` is initialised from a seed, and both
are saved atomically with a ``build_summary.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gmc.settings import ConfigError, PositiveInt, settings


@settings
class Qwen3Shape:
    """The shape of a locally built Qwen3-architecture model."""

    hidden_size: PositiveInt = 128
    """Width of the residual stream (a multiple of ``num_heads``)."""
    intermediate_size: PositiveInt = 384
    """Width of the MLP."""
    num_layers: PositiveInt = 4
    """Transformer layers."""
    num_heads: PositiveInt = 4
    """Attention heads."""
    num_kv_heads: PositiveInt = 2
    """Key/value heads (grouped-query attention; divides ``num_heads``)."""
    seed: int = 0
    """Seed of the initialisation (and of what the builder draws besides)."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"must divide by num_heads ({self.num_heads}), got {self.hidden_size}", "hidden_size")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"must divide by num_kv_heads ({self.num_kv_heads}), got {self.num_heads}", "num_heads")


def train_tokenizer(
    texts: list[str],
    vocab_size: int,
    special_tokens: tuple[str, ...] = ("<|endoftext|>", "<|pad|>"),
    eos: str = "<|endoftext|>",
    pad: str = "<|pad|>",
):
    """A byte-level BPE tokenizer of ``vocab_size`` entries trained on ``texts``, digits split
    into single tokens, padding on the left."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=pad, padding_side="left")


def qwen3_model(shape: Qwen3Shape, vocab_rows: int, **config: Any):
    """A randomly initialised ``Qwen3ForCausalLM`` of ``shape`` with ``vocab_rows`` embedding rows
    (tied to the LM head unless ``config`` says otherwise), seeded by ``shape.seed``; ``config``
    sets further ``Qwen3Config`` fields (token ids, positions, rope)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    mcfg = Qwen3Config(
        **{
            "vocab_size": vocab_rows,
            "hidden_size": shape.hidden_size,
            "intermediate_size": shape.intermediate_size,
            "num_hidden_layers": shape.num_layers,
            "num_attention_heads": shape.num_heads,
            "num_key_value_heads": shape.num_kv_heads,
            "head_dim": shape.hidden_size // shape.num_heads,
            "tie_word_embeddings": True,
            **config,
        }
    )
    torch.manual_seed(shape.seed)
    return Qwen3ForCausalLM(mcfg)


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def save_model(out: str | Path, model, tokenizer, summary: dict) -> None:
    """Model, tokenizer and ``build_summary.json`` into ``out``, atomically (the folder appears whole)."""
    from gmc.io import atomic_dir, write_json

    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_json(tmp / "build_summary.json", summary)
