"""``brisk generate`` end to end on the embedded default model (SmolLM2-135M-Instruct), greedy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from brisk.entrypoints.cli.main import main
from tests.cli.conftest import REPO_ROOT, TIMEOUT_S, assert_one_line_error, cli_command, cli_env

STATS = re.compile(r"^(\d+) tokens in [\d.]+ s \([\d.]+ tok/s\), time to first token [\d.]+ s$", re.MULTILINE)
QUESTION = "What is the capital of France?"


def test_generate_streams_the_answer():
    """Greedy answer to the MODELS.md question, read from stdout as it is produced: the text arrives in several
    reads while the process is still running, and before the stats line is written to stderr."""
    fd, err_path = tempfile.mkstemp(prefix="brisk-generate-", suffix=".err")
    os.close(fd)
    err_file = Path(err_path)
    args = ["generate", QUESTION, "--temperature", "0", "--max-tokens", "64", "--ignore-eos"]
    with err_file.open("w") as err:
        proc = subprocess.Popen(cli_command(*args), stdout=subprocess.PIPE, stderr=err, env=cli_env(), cwd=REPO_ROOT)
    watchdog = threading.Timer(TIMEOUT_S, proc.kill)
    watchdog.start()
    try:
        chunks, reads_while_running, stderr_at_first_read = [], 0, None
        while chunk := os.read(proc.stdout.fileno(), 65536):
            if proc.poll() is None:
                reads_while_running += 1
            if stderr_at_first_read is None:
                stderr_at_first_read = err_file.read_text()
            chunks.append(chunk)
        rc = proc.wait()
    finally:
        watchdog.cancel()
        proc.stdout.close()
    stderr = err_file.read_text()
    err_file.unlink()
    text = b"".join(chunks).decode()

    assert rc == 0, stderr
    assert "Paris" in text
    stats = STATS.findall(stderr)
    assert stats == ["64"], stderr  # --ignore-eos: exactly max_tokens
    assert not STATS.search(stderr_at_first_read), "stdout only arrived after generation ended"
    assert reads_while_running >= 2, f"stdout came in {len(chunks)} reads, {reads_while_running} before exit"


@pytest.fixture(scope="module")
def json_runs(tmp_path_factory):
    """The question through the chat template, and a sentence to complete with --raw; both --json (two runs)."""
    runs = {}
    for mode, prompt, extra in (("chat", QUESTION, []), ("raw", "The capital of France is", ["--raw"])):
        proc = subprocess.run(
            cli_command("generate", prompt, "--temperature", "0", "--max-tokens", "16", "--json", *extra),
            capture_output=True,
            text=True,
            env=cli_env(),
            cwd=REPO_ROOT,
            timeout=TIMEOUT_S,
        )
        assert proc.returncode == 0, proc.stderr
        runs[mode] = proc
    return runs


def test_json_output(json_runs):
    proc = json_runs["chat"]
    assert "tok/s" not in proc.stderr  # timings are in the object, not on stderr
    result = json.loads(proc.stdout)  # one object and nothing else on stdout
    assert "Paris" in result["text"]
    count = len(result["token_ids"])
    assert count == result["usage"]["completion_tokens"] >= 1
    assert count == 16 or result["finish_reason"] == "stop"
    assert result["finish_reason"] in ("stop", "length")
    usage = result["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    timings = result["timings"]
    assert timings["total_s"] > 0 and 0 < timings["time_to_first_token_s"] <= timings["total_s"]
    assert timings["tokens_per_s"] > 0 and timings["load_s"] > 0


def test_raw_skips_the_chat_template(json_runs):
    chat, raw = (json.loads(json_runs[m].stdout) for m in ("chat", "raw"))
    assert raw["raw"] is True and chat["raw"] is False
    # Completed as-is: the sentence goes on (greedy SmolLM2: " Paris.\n\n..."), it is not answered as a question.
    assert raw["text"].startswith(" Paris")
    assert len(raw["token_ids"]) == 16 or raw["finish_reason"] == "stop"
    # Five tokens of prompt, where the template wraps a question in SmolLM2's system message and role markers.
    assert raw["usage"]["prompt_tokens"] == 5 and chat["usage"]["prompt_tokens"] > 30


# ---- errors: argparse errors (exit 2) and bad values (exit 1), each a single line on stderr --------------------
@pytest.mark.parametrize(
    "argv, code, needle",
    [
        (["--temperature", "abc"], 2, "--temperature"),
        (["--bogus-flag"], 2, "--bogus-flag"),
        (["--max-tokens", "-3"], 1, "--max-tokens"),
        (["--top-p", "0"], 1, "--top-p"),
        (["--temperature", "-1"], 1, "--temperature"),
        (["--dtype", "float8"], 1, "dtype"),
        (["--raw", "--system", "be brief"], 1, "--system"),
        (["--threads", "0"], 1, "--threads"),
        (["--max-model-len", "0"], 2, "--max-model-len"),
        (["--kv-cache-memory-bytes", "lots"], 2, "--kv-cache-memory-bytes"),
    ],
)
def test_bad_flags(capsys, argv, code, needle):
    """In-process (no model is loaded for any of these): the exit code and the one-line message."""
    try:
        rc = main(["generate", "hello", *argv])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == code, err
    assert_one_line_error(err)
    assert err.startswith("brisk generate: error: ") and needle in err


def test_missing_model(cli):
    """As a subprocess: resolve's many-line FileNotFoundError becomes one line, exit 1, no traceback."""
    proc = cli("generate", "hello", "--model", "/nonexistent")
    assert proc.returncode == 1 and proc.stdout == ""
    assert_one_line_error(proc.stderr)
    assert "/nonexistent" in proc.stderr and "smollm2-135m-instruct" in proc.stderr


def test_prompt_from_stdin_needs_a_prompt(capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("   \n"))
    assert main(["generate", "-"]) == 1
    err = capsys.readouterr().err
    assert_one_line_error(err)
    assert "empty" in err


def test_sampling_flags_left_out_take_the_models_defaults(capsys, tiny_llama, tmp_path):
    """In-process on the tiny Llama: its generation_config.json recommends top_k 1 (greedy), which sampling flags
    left out take, so two seeds give the same tokens; ``--generation-config vllm`` falls back to the CLI's defaults
    (temperature 0.7, top-p 0.9) and a flag given beats the file, so the seeds then part."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_llama, folder)
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_k": 1}))

    def tokens(seed: int, *flags: str) -> list[int]:
        argv = ["generate", "The quick brown fox", "--model", str(folder), "--raw", "--json", "--max-tokens", "12"]
        assert main([*argv, "--ignore-eos", "--seed", str(seed), *flags]) == 0
        return json.loads(capsys.readouterr().out)["token_ids"]

    assert tokens(1) == tokens(2)
    assert tokens(1, "--generation-config", "vllm") != tokens(2, "--generation-config", "vllm")
    assert tokens(1, "--top-k", "0") != tokens(2, "--top-k", "0")
