"""A tokenizer's encode and decode pipeline saved from transformers' load of it, so that later starts of the
engine load it with the ``tokenizers`` library alone.

Importing transformers is most of a tokenizer's load: about 1 s on a 2-core CPU machine, 10 to 14 s on GPU hosts
whose image ships it without bytecode, and it holds the interpreter lock beside the engine's start-up
(docs/benchmarks.md, W7). What encode and decode run is the Rust pipeline of the tokenizer transformers built
(``backend_tokenizer``), whatever class built it: converted from SentencePiece, rebuilt from the vocabulary and
merges by a model's class, with the special tokens of ``tokenizer_config.json`` added. That pipeline, serialized
by the ``tokenizers`` library, is the snapshot, with the few fields the engine reads beside it; loading it takes
0.2 to 0.5 s. Where a folder has none yet, a child process loads the tokenizer through transformers and saves
it, on another core than the engine's start-up. What xgrammar detects of the vocabulary is saved with it, so
that structured outputs need no transformers tokenizer either.

A snapshot is saved only where it reproduces the tokenizer: the class is transformers' own and keeps the fast
base's encode and decode methods (so they run the pipeline and nothing else), and probe texts encode and decode
the same through both. It is keyed by the content of the folder's tokenizer and config files and by the versions
of transformers and tokenizers, so an edited chat template or an upgrade loads through transformers again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# How long a child process may take to load a tokenizer through transformers and save its snapshot.
CHILD_TIMEOUT_S = 300
_UNWRITABLE_EXIT = 3  # the child's exit status where the snapshot could not be written

# Bump when what a snapshot holds changes: older snapshots are then ignored (and replaced).
SNAPSHOT_FORMAT = 3

# The folder's files that can change what transformers builds (the class is chosen from the two configs).
KEY_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "tiktoken.model",
)
KEY_FOLDERS = ("additional_chat_templates",)  # every file in them (named templates)

# transformers' fast-tokenizer methods whose results a snapshot reproduces by running the pipeline; a class that
# overrides any of them may do more, and is not snapshotted.
REPRODUCED_METHODS = (
    "encode",
    "_encode_plus",
    "decode",
    "_decode",
    "convert_ids_to_tokens",
    "num_special_tokens_to_add",
    "get_vocab",
)

# Checked through both the tokenizer and its pipeline before a snapshot is saved: spaces before punctuation (which
# a clean-up pass after decoding would remove), contractions, accents, CJK, an emoji, runs of spaces and newlines.
PROBE_TEXTS = (
    "Hello , world . It 's a test ! Don 't stop ? (yes) [no] {maybe}",
    "  two  spaces,\ttab\nnewline\n\n  indented\r\n",
    "héllo wörld, naïve café; 東京 and 北京 🙂 done.",
    "def f(x):\n    return x ** 2  # square\n",
)


def snapshot_dir() -> Path:
    """Where snapshots live: ``tokenizers`` in brisk's cache of converted models (``$BRISK_CACHE_DIR``)."""
    from brisk.loader.resolve import cache_dir

    return cache_dir() / "tokenizers"


def snapshot_key(path) -> str | None:
    """A digest of ``path``'s tokenizer and config files and of the tokenizer libraries' versions; None where
    ``path`` is not a local folder with a ``tokenizer.json``."""
    folder = Path(os.path.expanduser(str(path)))
    if not (folder / "tokenizer.json").is_file():
        return None
    digest = hashlib.sha256(
        f"{SNAPSHOT_FORMAT} transformers {version('transformers')} tokenizers {version('tokenizers')}".encode()
    )
    files = [folder / name for name in KEY_FILES]
    files += [file for name in KEY_FOLDERS if (folder / name).is_dir() for file in sorted((folder / name).iterdir())]
    for file in files:
        if file.is_file():
            name = file.relative_to(folder).as_posix()
            digest.update(f"\0{name}\0{file.stat().st_size}\0".encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def save_snapshot(tokenizer, path) -> bool:
    """Save the snapshot of ``tokenizer`` (transformers' load of ``path``); False where it cannot be written.

    A tokenizer the pipeline would not reproduce is saved as a refusal, so that later starts load it through
    transformers at once instead of trying again. Written whole or not at all (a temporary file renamed), readable
    by everyone the cache's folder lets in."""
    key = snapshot_key(path)
    if key is None:
        return True
    fields: dict[str, Any] = {"format": SNAPSHOT_FORMAT, "reproduces": reproduces(tokenizer)}
    if fields["reproduces"]:
        fields |= {
            "class": type(tokenizer).__name__,
            "pipeline": tokenizer.backend_tokenizer.to_str(),
            "split_special_tokens": bool(tokenizer.split_special_tokens),
            "length": len(tokenizer),
            "vocab_size": tokenizer.vocab_size,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "unk_token_id": tokenizer.unk_token_id,
            "all_special_ids": list(tokenizer.all_special_ids),
            "all_special_tokens": list(tokenizer.all_special_tokens),
            "chat_template": tokenizer.chat_template,
            "special_tokens_map": tokenizer.special_tokens_map,
            "model_max_length": tokenizer.model_max_length,
            "xgrammar_metadata": _xgrammar_metadata(tokenizer),
        }
    folder = snapshot_dir()
    temporary = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False, encoding="utf-8") as out:
            temporary = out.name
            json.dump(fields, out)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # as an open() would have made it
        os.replace(temporary, folder / f"{key}.json")
    except (OSError, TypeError, ValueError) as exc:
        logger.warning("could not save the tokenizer of %s in %s for faster starts (%s)", path, folder, exc)
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        return False
    return True


def _xgrammar_metadata(tokenizer) -> dict[str, Any] | None:
    """What xgrammar detects of ``tokenizer``'s vocabulary (its kind and whether it adds a prefix space), which
    it otherwise reads from transformers' tokenizer; None without xgrammar."""
    try:
        import xgrammar as xgr
    except ImportError:
        return None
    try:
        metadata = json.loads(xgr.TokenizerInfo.from_huggingface(tokenizer).dump_metadata())
    except Exception as exc:  # xgrammar's own error types: grammars then read transformers' tokenizer
        logger.warning("xgrammar could not read the vocabulary of %s (%s)", tokenizer.name_or_path, exc)
        return None
    return {name: metadata[name] for name in ("vocab_type", "add_prefix_space")}


def snapshot_tokenizer(path, load_transformers_tokenizer: Callable[[], Any]) -> SnapshotTokenizer | None:
    """``path``'s tokenizer from its snapshot, saved first by a child process where there is none (or it is
    damaged); None where it must load through transformers (no ``tokenizer.json``, a tokenizer the snapshot would
    not reproduce, a snapshot that cannot be saved, or any failure on the way: that load reports real errors)."""
    try:
        key = snapshot_key(path)
        if key is None:
            return None
        tokenizer, refused = _from_snapshot(key, path, load_transformers_tokenizer)
        if tokenizer is not None or refused:
            return tokenizer
        with _one_saver(key):
            tokenizer, refused = _from_snapshot(key, path, load_transformers_tokenizer)
            if tokenizer is None and not refused and save_in_child_process(path):
                tokenizer, _ = _from_snapshot(key, path, load_transformers_tokenizer)
        return tokenizer
    except Exception as exc:  # never worse than loading through transformers
        logger.warning("could not use a saved tokenizer for %s (%s)", path, exc)
        return None


def _one_saver(key: str) -> contextlib.AbstractContextManager:
    """An inter-process lock on ``key``'s snapshot: one process saves it, the others (`brisk serve`'s engine and
    HTTP processes start on one folder at once) wait and then load what it saved. No lock where the cache cannot
    be written: the save reports that."""
    from brisk.loader.resolve import exclusive_lock

    lock = snapshot_dir() / f".lock-{key}"
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.touch()
    except OSError:
        return contextlib.nullcontext()
    return exclusive_lock(lock)


def _from_snapshot(key: str, path, load_transformers_tokenizer) -> tuple[SnapshotTokenizer | None, bool]:
    """The snapshot's tokenizer, and whether the snapshot is a refusal; (None, False) where there is none, or
    one of another format, or a damaged one (with a warning)."""
    try:
        fields = json.loads((snapshot_dir() / f"{key}.json").read_text(encoding="utf-8"))
        if not isinstance(fields, dict) or fields.get("format") != SNAPSHOT_FORMAT:
            return None, False
        if not fields.get("reproduces"):
            return None, True
        return SnapshotTokenizer(path, fields, load_transformers_tokenizer), False
    except FileNotFoundError:
        return None, False
    except Exception as exc:  # the tokenizers library raises a bare Exception on a bad pipeline
        logger.warning("ignoring the saved tokenizer of %s (%s)", path, exc)
        return None, False


def save_in_child_process(path) -> bool:
    """Load ``path``'s tokenizer through transformers in a child process and save its snapshot there; whether
    one was saved.

    The engine's first start on a folder then imports transformers on another core: on a thread of its own
    process the import holds the interpreter lock, and the weights, KV-cache and CUDA-graph phases beside it
    stretched by as much (benchmarks/results/HISTORY.md, twenty-ninth run; docs/benchmarks.md, thirty-fourth)."""
    package_root = str(Path(__file__).resolve().parents[2])  # the child imports this brisk, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH"))))}
    code = "import sys; from brisk.engine.tokenizer_snapshot import main; sys.exit(main(sys.argv[1]))"
    try:
        child = subprocess.run(
            [sys.executable, "-c", code, str(path)],
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=CHILD_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("could not save the tokenizer of %s in a child process (%s)", path, exc)
        return False
    if child.returncode == _UNWRITABLE_EXIT:
        logger.warning("%s", child.stderr.strip()[-2000:])
    elif child.returncode != 0:  # a tokenizer that fails to load: the load in this process says why
        logger.debug("the child process saving the tokenizer of %s failed: %s", path, child.stderr[-2000:])
    return child.returncode == 0


def main(path: str) -> int:
    """The child process of :func:`save_in_child_process`: 0 where it saved a snapshot (or a refusal)."""
    from brisk.engine.tokenizer import load_with_transformers

    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    return 0 if save_snapshot(load_with_transformers(path), path) else _UNWRITABLE_EXIT


def reproduces(tokenizer) -> bool:
    """Whether the pipeline alone gives ``tokenizer``'s encodings and decodings: a transformers fast tokenizer
    whose class keeps the fast base's methods, and the probe texts alike through both."""
    from transformers import PreTrainedTokenizerFast

    cls = type(tokenizer)
    if not isinstance(tokenizer, PreTrainedTokenizerFast) or not cls.__module__.startswith("transformers."):
        return False  # remote code, or a class outside the fast base
    if any(getattr(cls, name) is not getattr(PreTrainedTokenizerFast, name) for name in REPRODUCED_METHODS):
        return False
    pipeline = _load_pipeline(tokenizer.backend_tokenizer.to_str(), bool(tokenizer.split_special_tokens))
    for text in PROBE_TEXTS:
        for special in (True, False):
            ids = tokenizer.encode(text, add_special_tokens=special)
            if ids != pipeline.encode(text, add_special_tokens=special).ids:
                return False
            for skip in (True, False):
                if tokenizer.decode(ids, skip_special_tokens=skip) != pipeline.decode(ids, skip_special_tokens=skip):
                    return False
    return True


def _load_pipeline(serialized: str, split_special_tokens: bool):
    """A saved pipeline, set up as transformers' encode without truncation or padding sets it on every call."""
    from tokenizers import Tokenizer

    pipeline = Tokenizer.from_str(serialized)
    pipeline.no_truncation()
    pipeline.no_padding()
    pipeline.encode_special_tokens = split_special_tokens
    return pipeline


class SnapshotTokenizer:
    """The tokenizer transformers loads from a folder, with encode and decode run by its saved pipeline.

    Encoding, decoding, the vocabulary and the special-token ids need no transformers; chat templates render as
    text through transformers' own ``apply_chat_template`` on its generic fast class holding the same pipeline,
    template and special tokens (what rendering reads), which imports transformers' base but none of its model
    classes. Everything else (calls with arguments the pipeline does not take, a chat template tokenized by
    transformers) is answered by the transformers tokenizer itself, loaded on first use: attribute lookups this
    class does not answer go to it (``hasattr`` of a name neither has loads it too). Tokens added to that
    tokenizer do not reach the snapshot."""

    is_fast = True
    clean_up_tokenization_spaces = False  # a snapshot is saved only where decoding cleans nothing up

    def __init__(self, path, fields: dict[str, Any], load_transformers_tokenizer: Callable[[], Any]):
        self.backend_tokenizer = _load_pipeline(fields["pipeline"], fields["split_special_tokens"])
        self.name_or_path = str(path)
        self.vocab_size: int = fields["vocab_size"]
        self.bos_token_id: int | None = fields["bos_token_id"]
        self.eos_token_id: int | None = fields["eos_token_id"]
        self.pad_token_id: int | None = fields["pad_token_id"]
        self.unk_token_id: int | None = fields["unk_token_id"]
        self.all_special_ids: list[int] = fields["all_special_ids"]
        self.all_special_tokens: list[str] = fields["all_special_tokens"]
        self.chat_template = fields["chat_template"]
        self.model_max_length = fields["model_max_length"]
        self.xgrammar_metadata: dict[str, Any] | None = fields["xgrammar_metadata"]
        self._special_tokens_map: dict[str, Any] = fields["special_tokens_map"]
        self._length: int = fields["length"]
        self._load_transformers_tokenizer = load_transformers_tokenizer
        self._transformers_tokenizer = None
        self._chat_renderer = None
        self._loading = threading.Lock()

    @property
    def transformers_tokenizer(self):
        """The transformers tokenizer this was saved from (imports transformers the first time)."""
        with self._loading:
            if self._transformers_tokenizer is None:
                self._transformers_tokenizer = self._load_transformers_tokenizer()
            return self._transformers_tokenizer

    def chat_renderer(self):
        """transformers' generic fast tokenizer with this one's pipeline, chat template and special tokens, whose
        ``apply_chat_template`` renders as the original's (no tokenizer class overrides it); built the first time
        (a server builds it while its engine starts)."""
        with self._loading:
            if self._chat_renderer is None:
                from transformers import PreTrainedTokenizerFast

                self._chat_renderer = PreTrainedTokenizerFast(
                    tokenizer_object=self.backend_tokenizer,
                    chat_template=self.chat_template,
                    **self._special_tokens_map,
                )
            return self._chat_renderer

    def apply_chat_template(self, conversation, *args, tokenize: bool = True, **kwargs):
        if tokenize:
            return self.transformers_tokenizer.apply_chat_template(conversation, *args, tokenize=True, **kwargs)
        return self.chat_renderer().apply_chat_template(conversation, *args, tokenize=False, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("_"):  # private state (and lookups before __init__ has set it)
            raise AttributeError(name)
        return getattr(self.transformers_tokenizer, name)

    def __len__(self) -> int:
        return self._length

    def __call__(self, *args, **kwargs):
        return self.transformers_tokenizer(*args, **kwargs)

    def encode(self, text, text_pair=None, add_special_tokens: bool = True, **kwargs) -> list[int]:
        if text_pair is not None or kwargs or not isinstance(text, str):
            return self.transformers_tokenizer.encode(text, text_pair, add_special_tokens=add_special_tokens, **kwargs)
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids, skip_special_tokens: bool = False, **kwargs) -> str:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        if kwargs or not isinstance(token_ids, (list, tuple)) or (token_ids and not isinstance(token_ids[0], int)):
            return self.transformers_tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)
        return self.backend_tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        skipped = set(self.all_special_ids) if skip_special_tokens else set()
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skipped]

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return self.backend_tokenizer.num_special_tokens_to_add(pair)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)


def transformers_tokenizer(tokenizer):
    """``tokenizer`` as transformers loads it: a snapshot's own, others as they are (for libraries that take only
    transformers' classes, such as xgrammar's vocabulary reader)."""
    return tokenizer.transformers_tokenizer if isinstance(tokenizer, SnapshotTokenizer) else tokenizer


def encode_batch(tokenizer, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
    """The token ids of each text in one call (the ``tokenizers`` library encodes a batch on its own threads):
    a snapshot's pipeline directly, which its ``__call__`` would hand to transformers' tokenizer."""
    if isinstance(tokenizer, SnapshotTokenizer):
        encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [encoding.ids for encoding in encodings]
    return tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]


def xgrammar_tokenizer_info(tokenizer, vocab_size: int, stop_token_ids: list[int]):
    """xgrammar's ``TokenizerInfo`` of ``tokenizer``'s vocabulary, padded or cut to ``vocab_size`` entries (the
    model's): for a snapshot, from its vocabulary and what xgrammar detected on transformers' tokenizer when it
    was saved, so that a first structured request does not import transformers' tokenizer classes beside the
    running steps; else xgrammar's own reading of transformers' tokenizer."""
    import xgrammar as xgr

    if isinstance(tokenizer, SnapshotTokenizer) and tokenizer.xgrammar_metadata is not None:
        vocabulary = [""] * vocab_size  # as xgrammar lays out a transformers vocabulary
        for token, index in tokenizer.get_vocab().items():
            if index < vocab_size:
                vocabulary[index] = token
        metadata = {**tokenizer.xgrammar_metadata, "vocab_size": vocab_size, "stop_token_ids": stop_token_ids}
        return xgr.TokenizerInfo.from_vocab_and_metadata(vocabulary, json.dumps(metadata))
    return xgr.TokenizerInfo.from_huggingface(
        transformers_tokenizer(tokenizer), vocab_size=vocab_size, stop_token_ids=stop_token_ids
    )
