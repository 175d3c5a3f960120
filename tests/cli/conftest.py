"""Run ``python -m brisk.entrypoints.cli.main ...`` as a subprocess, as a user would run ``brisk``.

Each run that loads the embedded default model costs a few seconds on 2 CPU cores (torch + transformers imports,
538 MB of float32 weights); the first run ever also converts the GGUF (about 3 s). One torch thread per process:
the CI machine's cores are shared with other jobs, and oversubscribed OpenMP threads are far slower than one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300


def cli_env() -> dict[str, str]:
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "brisk.entrypoints.cli.main", *args]


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli_command(*args),
        input=stdin,
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=REPO_ROOT,
        timeout=TIMEOUT_S,
    )


def assert_one_line_error(stderr: str) -> None:
    """A failure reads as one ``brisk CMD: error: ...`` line: no traceback, no usage block."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert ": error: " in lines[0], stderr


@pytest.fixture
def cli():
    return run_cli
