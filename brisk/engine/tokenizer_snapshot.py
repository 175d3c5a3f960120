"""A tokenizer's encode and decode pipeline saved from transformers' load of it, so that later starts of the
engine load it with the ``tokenizers`` library alone.

Importing transformers is most of a tokenizer's load: about 1 s on a 2-core CPU machine, 10 to 14 s on GPU hosts
whose image ships it without bytecode, and it holds the interpreter lock beside the engine's start-up
(docs/benchmarks.md, W7). What encode and decode run is the Rust pipeline of the tokenizer transformers built
(``backend_tokenizer``), whatever class built it: converted from SentencePiece, rebuilt from the vocabulary and
merges by a model's class, with the special tokens of ``tokenizer_config.json`` added. That pipeline, serialized
by the ``tokenizers`` library, is the snapshot, with the few fields the engine reads beside it; loading it takes
0.2 to 0.5 s. Where a folder has none yet, a child process loads the tokenizer through transformers and saves
it, on another core than the engine's start-up.

A snapshot is saved only where it reproduces the tokenizer: the class is transformers' own and keeps the fast
base's encode and decode methods (so they run the pipeline and nothing else), and probe texts encode and decode
the same through both. It is keyed by the content of the folder's tokenizer and config files and by the versions
of transformers and tokenizers, so an edited chat template or an upgrade loads through transformers again.
"""

from __future__ import annotations

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
_NOT_SAVED_EXIT = 3  # the child's exit status where the tokenizer loaded but a snapshot would not reproduce it

# Bump when what a snapshot holds changes: older snapshots are then ignored (and replaced).
SNAPSHOT_FORMAT = 1

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
    for name in KEY_FILES:
        file = folder / name
        if file.is_file():
            digest.update(f"\0{name}\0{file.stat().st_size}\0".encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def save_snapshot(tokenizer, path) -> bool:
    """Save ``tokenizer`` (transformers' load of ``path``) as a snapshot where it reproduces it; whether it did.
    A failure to write is logged, never raised: the next start loads through transformers again."""
    key = snapshot_key(path)
    if key is None or not reproduces(tokenizer):
        return False
    fields = {
        "format": SNAPSHOT_FORMAT,
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
        "model_max_length": tokenizer.model_max_length,
    }
    folder = snapshot_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False, encoding="utf-8") as out:
            json.dump(fields, out)
        os.replace(out.name, folder / f"{key}.json")  # whole or not at all, for processes starting meanwhile
    except (OSError, TypeError, ValueError) as exc:
        logger.warning("could not save the tokenizer of %s for faster starts (%s)", path, exc)
        return False
    return True


def save_in_child_process(path) -> bool:
    """Load ``path``'s tokenizer through transformers in a child process and save its snapshot there; whether
    one was saved.

    The engine's first start on a folder then imports transformers on another core: on a thread of its own
    process the import holds the interpreter lock, and the weights, KV-cache and CUDA-graph phases beside it
    stretched by as much (docs/benchmarks.md, the twenty-ninth and thirty-fourth runs)."""
    package_root = str(Path(__file__).resolve().parents[2])  # the child imports this brisk, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH"))))}
    code = "import sys; from brisk.engine.tokenizer_snapshot import main; sys.exit(main(sys.argv[1]))"
    try:
        child = subprocess.run(
            [sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("could not save the tokenizer of %s in a child process (%s)", path, exc)
        return False
    if child.returncode not in (0, _NOT_SAVED_EXIT):
        logger.warning("saving the tokenizer of %s in a child process failed: %s", path, child.stderr[-2000:])
    return child.returncode == 0


def main(path: str) -> int:
    """The child process of :func:`save_in_child_process`: 0 where it saved a snapshot."""
    from brisk.engine.tokenizer import load_with_transformers

    return 0 if save_snapshot(load_with_transformers(path), path) else _NOT_SAVED_EXIT


def reproduces(tokenizer) -> bool:
    """Whether the pipeline alone gives ``tokenizer``'s encodings and decodings: a transformers fast tokenizer
    whose class keeps the fast base's methods, and the probe texts alike through both."""
    from transformers import PreTrainedTokenizerFast

    cls = type(tokenizer)
    if not isinstance(tokenizer, PreTrainedTokenizerFast) or not cls.__module__.startswith("transformers."):
        return False  # remote code, or a class outside the fast base
    if any(getattr(cls, name) is not getattr(PreTrainedTokenizerFast, name) for name in REPRODUCED_METHODS):
        return False
    pipeline = tokenizer.backend_tokenizer
    for text in PROBE_TEXTS:
        for special in (True, False):
            ids = tokenizer.encode(text, add_special_tokens=special)
            if ids != pipeline.encode(text, add_special_tokens=special).ids:
                return False
            for skip in (True, False):
                if tokenizer.decode(ids, skip_special_tokens=skip) != pipeline.decode(ids, skip_special_tokens=skip):
                    return False
    return True


def load_snapshot(path, load_transformers_tokenizer: Callable[[], Any]) -> SnapshotTokenizer | None:
    """The snapshot of ``path``'s tokenizer, or None where there is none (or it cannot be read)."""
    key = snapshot_key(path)
    if key is None:
        return None
    try:
        fields = json.loads((snapshot_dir() / f"{key}.json").read_text(encoding="utf-8"))
        if fields.get("format") != SNAPSHOT_FORMAT:
            return None
        return SnapshotTokenizer(path, fields, load_transformers_tokenizer)
    except FileNotFoundError:
        return None
    except Exception as exc:  # a damaged file: the tokenizers library raises a bare Exception on a bad pipeline
        logger.warning("ignoring the saved tokenizer of %s (%s)", path, exc)
        return None


class SnapshotTokenizer:
    """The tokenizer transformers loads from a folder, with encode and decode run by its saved pipeline.

    Encoding, decoding, the vocabulary and the special-token ids need no transformers. Everything else (chat
    templates, grammars' vocabulary tables, calls with arguments the pipeline does not take) is answered by the
    transformers tokenizer itself, loaded on first use: attribute lookups this class does not answer go to it."""

    is_fast = True
    clean_up_tokenization_spaces = False  # a snapshot is saved only where decoding cleans nothing up

    def __init__(self, path, fields: dict[str, Any], load_transformers_tokenizer: Callable[[], Any]):
        from tokenizers import Tokenizer

        pipeline = Tokenizer.from_str(fields["pipeline"])
        pipeline.no_truncation()  # as transformers' encode without truncation or padding sets them
        pipeline.no_padding()
        pipeline.encode_special_tokens = fields["split_special_tokens"]
        self.backend_tokenizer = pipeline
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
        self._length: int = fields["length"]
        self._load_transformers_tokenizer = load_transformers_tokenizer
        self._transformers_tokenizer = None
        self._loading = threading.Lock()

    @property
    def transformers_tokenizer(self):
        """The transformers tokenizer this was saved from (imports transformers the first time)."""
        with self._loading:
            if self._transformers_tokenizer is None:
                self._transformers_tokenizer = self._load_transformers_tokenizer()
            return self._transformers_tokenizer

    def __getattr__(self, name: str):
        if name.startswith("_"):  # private state (and lookups before __init__ has set it)
            raise AttributeError(name)
        return getattr(self.transformers_tokenizer, name)

    def __len__(self) -> int:
        return self._length

    def encode(self, text, add_special_tokens: bool = True, **kwargs) -> list[int]:
        if kwargs or not isinstance(text, str):
            return self.transformers_tokenizer.encode(text, add_special_tokens=add_special_tokens, **kwargs)
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
