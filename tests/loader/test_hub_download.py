"""Hub ids are downloaded with huggingface_hub: only the files brisk reads, at a revision, with a token, into a
chosen folder; offline or unreachable, a one-paragraph error that says what to do.

No hub is reachable here: ``fake_hub.FakeHub`` serves tiny checkpoints the way the hub's file API does, and
``HF_ENDPOINT`` (``huggingface_hub.constants.ENDPOINT`` in-process) points at it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import huggingface_hub.constants
import pytest
import torch

from brisk.loader.resolve import resolve_model
from tests.loader.fake_hub import FakeHub, FakeRepo

MAIN = "1" * 40
OTHER = "2" * 40


@pytest.fixture(scope="module")
def hub(tiny_llama, tmp_path_factory):
    """Two commits of a tiny Llama (``main``, and tag ``v2`` whose config has one more key), with files brisk must
    not fetch."""
    root = tmp_path_factory.mktemp("hub")
    main, other = root / "main", root / "v2"
    shutil.copytree(tiny_llama, main)
    (main / "pytorch_model.bin").write_bytes(b"pickled weights brisk never reads")
    (main / "model-q4.gguf").write_bytes(b"GGUF" + bytes(60))
    (main / "README.md").write_text("# tiny\n")
    shutil.copytree(tiny_llama, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "revision_marker": "v2"}))
    fake = FakeHub(
        {
            "acme/tiny": FakeRepo({"main": MAIN, "v2": OTHER}, {MAIN: main, OTHER: other}),
            "acme/private": FakeRepo({"main": MAIN}, {MAIN: main}, token="hf_secret"),
        }
    )
    server, url = fake.serve()
    yield fake, url
    server.shutdown()


@pytest.fixture
def use_hub(hub, tmp_path, monkeypatch):
    fake, url = hub
    fake.downloaded.clear()
    _point_at(monkeypatch, url)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return fake


def _point_at(monkeypatch, url: str) -> None:
    """What HF_ENDPOINT does when set before huggingface_hub is imported (it already is, by transformers)."""
    constants = huggingface_hub.constants
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")


def test_download_fetches_only_what_brisk_reads(use_hub):
    folder = resolve_model("acme/tiny", torch.float32)
    assert folder.name == MAIN and (folder / "config.json").is_file()
    fetched = {p.removeprefix("acme/tiny/") for p in use_hub.downloaded}
    assert "model.safetensors" in fetched and "config.json" in fetched and "tokenizer.json" in fetched
    assert not fetched & {"pytorch_model.bin", "model-q4.gguf", "README.md"}
    # A second start finds the cache: the hub is asked for the commit, but no file is fetched again.
    use_hub.downloaded.clear()
    assert resolve_model("acme/tiny", torch.float32) == folder
    assert use_hub.downloaded == []


def test_revision_and_download_dir(use_hub, tmp_path):
    folder = resolve_model("acme/tiny", torch.float32, revision="v2", download_dir=tmp_path / "models")
    assert folder.name == OTHER and folder.is_relative_to(tmp_path / "models")
    assert json.loads((folder / "config.json").read_text())["revision_marker"] == "v2"
    with pytest.raises(FileNotFoundError, match="has no revision 'v9'") as e:
        resolve_model("acme/tiny", torch.float32, revision="v9")
    assert e.value.__cause__ is None and e.value.__context__ is None  # no hub stack trace attached


def test_private_repo_needs_the_token(use_hub, monkeypatch):
    with pytest.raises(FileNotFoundError, match="HF_TOKEN"):
        resolve_model("acme/private", torch.float32)
    with pytest.raises(FileNotFoundError, match="not found on the Hugging Face hub"):
        resolve_model("acme/missing", torch.float32)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert (resolve_model("acme/private", torch.float32) / "model.safetensors").is_file()


def test_offline_uses_the_cache_or_says_so(use_hub, monkeypatch):
    folder = resolve_model("acme/tiny", torch.float32)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert resolve_model("acme/tiny", torch.float32) == folder
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set"):
        resolve_model("acme/tiny", torch.float32, revision="v2")


def test_unreachable_hub_says_the_machine_is_offline(use_hub, monkeypatch):
    _point_at(monkeypatch, "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(FileNotFoundError, match="could not be reached") as e:
        resolve_model("acme/tiny", torch.float32)
    assert "offline" in str(e.value) and e.value.__cause__ is None


def test_brisk_generate_downloads_a_hub_model(hub, tmp_path):
    """The whole path as a user runs it: environment variables, the CLI's --revision and --download-dir flags."""
    _, url = hub
    env = {**os.environ, "HF_ENDPOINT": url, "HF_HOME": str(tmp_path / "home"), "BRISK_CACHE_DIR": str(tmp_path)}
    env.pop("HF_HUB_OFFLINE", None)
    run = subprocess.run(
        [sys.executable, "-m", "brisk.entrypoints.cli.main", "generate", "Hello", "--model", "acme/tiny",
         "--revision", "v2", "--download-dir", str(tmp_path / "dl"), "--max-tokens", "4", "--temperature", "0"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert any((tmp_path / "dl").rglob(f"snapshots/{OTHER}/model.safetensors"))
