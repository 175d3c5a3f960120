"""Every ``curl`` in the docs runs as written against a live server (only the address is this test's): each
must answer 200 with a body that is not an error."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess

import pytest

from tests.server.conftest import ServerProcess

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOC_ADDRESS = "127.0.0.1:8000"


def doc_curls() -> list[tuple[str, str]]:
    """``(where, command)`` for each curl command in a bash block of the docs (continuation lines and quoted
    arguments over several lines joined)."""
    found = []
    for path in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S):
            command = ""
            for line in block.splitlines():
                command += line
                if command.endswith("\\"):  # a continuation line
                    command = command[:-1]
                    continue
                if command.count("'") % 2:  # inside a quoted argument that spans lines
                    command += "\n"
                    continue
                if command.lstrip().startswith("curl "):
                    found.append((path.name, command.strip()))
                command = ""
    return found


CURLS = doc_curls()


def test_the_docs_have_curls():
    assert len(CURLS) >= 4, CURLS


@pytest.fixture(scope="module")
def docs_server(tiny_model_dir):
    proc = ServerProcess(tiny_model_dir, "--served-model-name", "smollm2-135m-instruct")
    yield proc
    proc.stop()


@pytest.mark.parametrize("where, command", CURLS, ids=[f"{w}:{c[:40]}" for w, c in CURLS])
def test_doc_curl_runs_as_written(docs_server, where, command):
    if DOC_ADDRESS not in command:
        pytest.fail(f"{where}: a curl that does not use {DOC_ADDRESS}: {command}")
    command = command.replace(DOC_ADDRESS, docs_server.url.removeprefix("http://"))
    run = subprocess.run(
        ["bash", "-c", command + " -sS -w '\\n%{http_code}'"],
        env={**os.environ, "BRISK_API_KEY": docs_server.api_key},
        capture_output=True,
        text=True,
        timeout=120,
    )
    body, _, status = run.stdout.rpartition("\n")
    assert run.returncode == 0 and status == "200", f"{where}: {command}\n{run.stdout}\n{run.stderr}"
    assert '"error"' not in body, body
