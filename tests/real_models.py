"""The real models that come as pip packages: a test that needs one is skipped, saying how to install it, when
its packages are missing."""

from __future__ import annotations

import pytest

from brisk.loader.resolve import KNOWN_MODELS, KnownModel, locate_known


def installed(name: str) -> tuple[KnownModel, pytest.MarkDecorator]:
    """The known model ``name`` and a ``skipif`` mark for when its packages are not installed."""
    known = KNOWN_MODELS[name]
    try:
        locate_known(known)
        missing = None
    except FileNotFoundError:
        missing = f"{known.name} is not installed ({known.pip_install})"
    return known, pytest.mark.skipif(missing is not None, reason=missing or "")
