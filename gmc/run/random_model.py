"""A random-init Qwen3-architecture model with Qwen3's vocabulary width and chat format, built
locally without any download: the stand-in that runs the paper's code path on a CPU.

:func:`build_random_qwen3` trains a byte-level BPE tokenizer on the local MATH problems, adds
Qwen3's special tokens (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ``<think>``,
``</think>``) and a Qwen3-style chat template that honours ``enable_thinking``, and builds a
randomly initialised ``Qwen3ForCausalLM`` whose embedding has 151,936 rows (Qwen3's padded
vocabulary; the tokenizer fills only the first few thousand, as Qwen3's fills the first
151,669). Like Qwen3 it ends a turn with ``<|im_end|>`` (the tokenizer's EOS), pads with
``<|endoftext|>``, lists both as end ids in ``generation_config.eos_token_id``, ties the
embedding to the LM head (as Qwen3-4B does) and is saved in bfloat16. The model is not
trained: it proves that shapes, dtypes and memory paths work, not that anything is learned.
"""

from __future__ import annotations

import time
from pathlib import Path

from gmc.policy.build import Qwen3Shape, count_parameters, qwen3_model, save_model, train_tokenizer
from gmc.settings import ConfigError, PositiveInt, settings, to_dict

QWEN3_VOCAB_ROWS = 151_936
"""Embedding rows of every Qwen3 model (the tokenizer has 151,669 entries)."""

QWEN3_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>")
"""Turn delimiters (special: removed when decoding with ``skip_special_tokens``)."""

QWEN3_THINK_TOKENS = ("<think>", "</think>")
"""Reasoning delimiters (added tokens that are not special: they stay in decoded text)."""

QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
"""Qwen3's chat format for plain text turns: ``<|im_start|>role\\n...<|im_end|>\\n``; the
generation prompt opens an assistant turn and, with ``enable_thinking=False``, closes an empty
``<think>`` block so the model answers directly (Qwen3's switch; thinking is on by default)."""


@settings
class RandomModelConfig(Qwen3Shape):
    """Shape of the random Qwen3-architecture model and of its tokenizer."""

    hidden_size: PositiveInt = 64
    """Width of the residual stream (a multiple of ``num_heads``)."""
    intermediate_size: PositiveInt = 192
    """Width of the MLP."""
    num_layers: PositiveInt = 2
    """Transformer layers."""
    vocab_rows: PositiveInt = QWEN3_VOCAB_ROWS
    """Rows of the (tied) embedding and LM head."""
    tokenizer_vocab: PositiveInt = 4096
    """BPE entries learned from the MATH prompts (plus the special tokens)."""
    tokenizer_problems: PositiveInt = 2000
    """MATH training problems the tokenizer is trained on."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tokenizer_vocab + 8 > self.vocab_rows:
            raise ConfigError(
                f"must exceed the tokenizer's entries ({self.tokenizer_vocab} + 8), got {self.vocab_rows}", "vocab_rows"
            )


def qwen3_style_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on ``texts`` with Qwen3's special tokens, end and pad
    tokens and chat template."""
    tokenizer = train_tokenizer(texts, vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN3_SPECIAL_TOKENS)})
    tokenizer.add_tokens(list(QWEN3_THINK_TOKENS))
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer


def build_random_qwen3(
    out: str | Path,
    cfg: RandomModelConfig = RandomModelConfig(),
    data_root: str | None = None,
    data_source: str = "local",
) -> dict:
    """Build the tokenizer and the random model and save both (bfloat16) under ``out``;
    returns a summary dict (also written to ``build_summary.json``)."""
    import torch
    from transformers import GenerationConfig

    from gmc.tasks.datasets import INSTRUCTION, load_dataset

    start = time.time()
    records = load_dataset("math", source=data_source, root=data_root, limit=cfg.tokenizer_problems)
    # the text of the chat turns the prompts are made of (the tags are added as whole tokens)
    texts = [f"user\n{r.problem}\n{INSTRUCTION}\nassistant\n" for r in records]
    tokenizer = qwen3_style_tokenizer(texts, cfg.tokenizer_vocab)
    end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model = qwen3_model(
        cfg,
        cfg.vocab_rows,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        bos_token_id=end_of_text,
        eos_token_id=im_end,
        pad_token_id=end_of_text,
    )
    model = model.to(torch.bfloat16).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=end_of_text,
        eos_token_id=[im_end, end_of_text],
        pad_token_id=end_of_text,
        do_sample=True,
        temperature=0.6,
        top_p=0.95,
        top_k=20,
    )
    summary = {
        "parameters": count_parameters(model),
        "vocab_rows": cfg.vocab_rows,
        "tokenizer_entries": len(tokenizer),
        "eos_token_ids": [im_end, end_of_text],
        "config": to_dict(cfg),
        "seconds": round(time.time() - start, 1),
    }
    save_model(out, model, tokenizer, summary)
    return summary
