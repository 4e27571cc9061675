"""Checks before the expensive part: a model folder is complete before anything loads it.

A local model folder needs ``config.json``, weights (``model.safetensors``, a sharded
``model.safetensors.index.json`` with every shard it lists, or the ``pytorch_model.bin``
equivalents) and tokenizer files; every safetensors file must be as long as its header says,
so a half-written copy is named instead of failing deep inside the loader. A name that is not
a local folder and looks like a hub id (``org/name``) is left to the hub's loader.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")
"""Any one of these holds a tokenizer's vocabulary."""


class ModelFolderError(OSError):
    """A model folder is missing something or holds a damaged file; the message names it."""


def looks_local(name_or_path: str) -> bool:
    """A filesystem path rather than a hub id: it exists, is absolute or relative with ``.``,
    or has more than one ``/``."""
    return (
        os.path.exists(name_or_path)
        or os.path.isabs(name_or_path)
        or name_or_path.startswith(".")
        or name_or_path.count("/") > 1
    )


MODEL_KEY = "the key model, --set model=FOLDER (gmc evaluate: --model FOLDER)"
"""Where a command takes its model, as the errors of a model that cannot be loaded say."""


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub's host (``HF_ENDPOINT``) takes a connection within ``timeout``
    seconds: where it does not, a model is looked up in the local cache only, at once, instead of
    after the hub client's retries."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError:
        return False
    return True


def check_model_dir(name_or_path: str) -> None:
    """Raise :class:`ModelFolderError` naming what a local model folder lacks; hub ids pass."""
    if not looks_local(name_or_path):
        return
    folder = Path(name_or_path)
    if not folder.is_dir():
        raise ModelFolderError(
            f"model folder {folder} not found (make one with `gmc build-tiny-model --out {folder}` or "
            f"`gmc fetch-model`, or name another: {MODEL_KEY})"
        )
    missing = []
    if not (folder / "config.json").exists():
        missing.append("config.json")
    weights = _weight_files(folder)
    if weights is None:
        missing.append("weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin)")
    if not any((folder / name).exists() for name in TOKENIZER_FILES):
        missing.append(f"a tokenizer (one of {', '.join(TOKENIZER_FILES)})")
    if missing:
        raise ModelFolderError(f"model folder {folder} lacks {'; '.join(missing)}")
    for path in weights:
        if not path.exists():
            raise ModelFolderError(f"model folder {folder}: weight shard {path.name} is missing")
        if path.suffix == ".safetensors":
            check_safetensors(path)


def _weight_files(folder: Path) -> list[Path] | None:
    for single, index in (
        ("model.safetensors", "model.safetensors.index.json"),
        ("pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        if (folder / single).exists():
            return [folder / single]
        if (folder / index).exists():
            try:
                weight_map = json.loads((folder / index).read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ModelFolderError(f"{folder / index}: not a weight index ({e})") from None
            return [folder / name for name in sorted(set(weight_map.values()))]
    return None


def check_safetensors(path: Path) -> None:
    """A safetensors file is 8 bytes of header length, a JSON header of tensor offsets, then the
    data: its size must be exactly what the header describes."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 0 or 8 + n > size:
            raise ModelFolderError(f"{path}: incomplete safetensors file ({size} bytes; half-written or truncated?)")
        try:
            header = json.loads(fh.read(n))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            raise ModelFolderError(f"{path}: damaged safetensors header") from None
    if 8 + n + end != size:
        raise ModelFolderError(
            f"{path}: incomplete safetensors file ({size} bytes, its header describes "
            f"{8 + n + end}; half-written or truncated?)"
        )
