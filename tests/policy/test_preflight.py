"""Model folders are checked before anything loads them: a missing tokenizer, half-written
weights, a missing config and a missing folder are each named."""

import shutil

import pytest


def test_model_folders_are_checked_before_loading(tmp_path, tiny_model_dir):
    from gmc.policy.model import load_policy
    from gmc.policy.preflight import ModelFolderError

    def broken(name, damage):
        folder = tmp_path / name
        shutil.copytree(tiny_model_dir, folder)
        damage(folder)
        return str(folder)

    no_tokenizer = broken("no_tokenizer", lambda f: (f / "tokenizer.json").unlink())
    with pytest.raises(ModelFolderError, match="lacks a tokenizer"):
        load_policy(no_tokenizer, device="cpu")

    def truncate(folder):
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-1000])

    with pytest.raises(ModelFolderError, match=r"model\.safetensors: incomplete safetensors file"):
        load_policy(broken("half_written", truncate), device="cpu")
    with pytest.raises(ModelFolderError, match=r"lacks config\.json; weights"):
        load_policy(
            broken("empty", lambda f: [p.unlink() for p in f.iterdir() if not p.name.startswith("tok")]), device="cpu"
        )
    with pytest.raises(ModelFolderError, match=r"not found .* name another: the key model, --set model=FOLDER"):
        load_policy(str(tmp_path / "nowhere" / "tiny"), device="cpu")


def test_a_hub_name_offline_fails_at_once_naming_the_key(monkeypatch, tmp_path):
    """Where the hub cannot be reached, a name that is no local folder is looked up in the cache
    only: the error comes at once (no retries) and names the key ``model``."""
    import time

    import gmc.policy.model as model

    monkeypatch.setattr(model, "hub_reachable", lambda: False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache
    start = time.monotonic()
    with pytest.raises(
        OSError,
        match=r"'models/tiny': not a local folder, .* Name a local folder instead \(the key model, --set model=FOLDER",
    ):
        model.load_policy("models/tiny", device="cpu")
    assert time.monotonic() - start < 20
