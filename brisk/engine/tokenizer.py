"""Loading a tokenizer, for the engine and the server's HTTP side alike (this module imports nothing heavy)."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def load_tokenizer(path, optional: bool = False):
    """The tokenizer at ``path``; an error that names it, or None with a warning when ``optional``."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # the tokenizers library raises a bare Exception for a corrupt tokenizer.json
        if optional:
            logger.warning("no tokenizer in %s (%s): only token-id prompts will work", path, exc)
            return None
        raise ValueError(f"Cannot load a tokenizer from {path}: {exc}") from exc
