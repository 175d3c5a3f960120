"""``brisk serve`` flags -> EngineArgs + ServerConfig (no server started)."""

from __future__ import annotations

import argparse

import pytest
import torch

from brisk.config import default_max_num_batched_tokens
from brisk.entrypoints.cli.main import build_parser
from brisk.entrypoints.cli.serve import DEFAULT_MODEL, build_configs, parse_bytes
from brisk.entrypoints.openai.server import is_loopback, security_warning


def _configs(*argv):
    return build_configs(build_parser().parse_args(["serve", *argv]))


def test_defaults(monkeypatch):
    monkeypatch.delenv("BRISK_API_KEY", raising=False)
    engine, server = _configs()
    assert engine.model == DEFAULT_MODEL == "smollm2-135m-instruct"
    assert server.served_model_names == [DEFAULT_MODEL]
    assert server.host == "127.0.0.1" and server.port == 8000 and server.api_key is None
    assert engine.enable_prefix_caching is True and engine.max_num_seqs == 256


def test_vllm_engine_flags(monkeypatch):
    monkeypatch.delenv("BRISK_API_KEY", raising=False)
    engine, server = _configs(
        "some/model",
        "--max-model-len", "2048",
        "--gpu-memory-utilization", "0.5",
        "--max-num-seqs", "8",
        "--max-num-batched-tokens", "512",
        "--block-size", "32",
        "--no-enable-prefix-caching",
        "--dtype", "float32",
        "--seed", "7",
        "--served-model-name", "a", "b",
        "--chat-template", "{{ messages }}",
        "--load-format", "dummy",
        "--device", "cuda",
        "--enforce-eager",
        "--attention-backend", "torch",
        "--api-key", "k",
        "--max-n", "4",
        "--max-tokens-limit", "100",
        "--max-waiting-requests", "0",
        "--max-request-body-bytes", "1M",
        "--shutdown-timeout", "5",
        "--port", "0",
    )  # fmt: skip
    assert engine.model == "some/model" and engine.max_model_len == 2048
    assert engine.gpu_memory_utilization == 0.5 and engine.max_num_seqs == 8
    assert engine.max_num_batched_tokens == 512 and engine.block_size == 32
    assert engine.enable_prefix_caching is False and engine.dtype == "float32" and engine.seed == 7
    assert engine.load_format == "dummy" and engine.device == "cuda"
    assert engine.enforce_eager is True and engine.attention_backend == "torch"
    assert server.served_model_names == ["a", "b"] and server.model_name == "a"
    assert server.chat_template == "{{ messages }}" and server.api_key == "k"
    assert server.max_n == 4 and server.max_tokens_limit == 100 and server.max_waiting_requests is None
    assert server.max_request_body_bytes == 1 << 20 and server.shutdown_timeout == 5 and server.port == 0


def test_kv_cache_size_flags():
    engine, _ = _configs("--device", "cpu", "--kv-cache-memory-bytes", "64MiB")
    assert engine.kv_cache_memory_bytes == 64 << 20 and engine.gpu_memory_utilization is None
    # Both size the KV cache: one would be ignored, so giving both is an error.
    with pytest.raises(ValueError, match="give one of them"):
        _configs("--gpu-memory-utilization", "0.5", "--kv-cache-memory-bytes", "64MiB")


def test_api_key_from_env(monkeypatch):
    monkeypatch.setenv("BRISK_API_KEY", "from-env")
    assert _configs()[1].api_key == "from-env"
    assert _configs("--api-key", "flag")[1].api_key == "flag"


def test_chat_template_file(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert _configs("--chat-template", str(path))[1].chat_template == path.read_text()
    with pytest.raises(FileNotFoundError):
        _configs("--chat-template", str(tmp_path / "missing.jinja"))


def test_model_flag_spelling():
    assert _configs("--model", "x/y")[0].model == "x/y"
    with pytest.raises(ValueError, match="disagree"):
        _configs("a", "--model", "b")


@pytest.mark.parametrize(
    ("text", "value"), [("123", 123), ("2k", 2048), ("512M", 512 << 20), ("4GiB", 4 << 30), ("1.5k", 1536)]
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


def test_parse_bytes_rejects_garbage():
    with pytest.raises(argparse.ArgumentTypeError):
        parse_bytes("lots")


def test_security_warning():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    assert security_warning("127.0.0.1", None) is None
    assert security_warning("0.0.0.0", "key") is None
    assert "WITHOUT AN API KEY" in security_warning("0.0.0.0", None)


def test_threads_leave_a_core_to_the_front_end():
    """Unset, the engine takes every usable core but one (at least one); --threads overrides it."""
    from brisk.config import usable_cores

    assert _configs()[0].cpu_threads == max(1, usable_cores() - 1)
    assert _configs("--threads", "3")[0].cpu_threads == 3
    with pytest.raises(SystemExit):
        _configs("--threads", "0")


def test_engine_flags_are_engine_arguments():
    from brisk.config import EngineArgs
    from brisk.entrypoints.cli.engine_args import ENGINE_FLAGS

    assert set(ENGINE_FLAGS) <= set(EngineArgs.__dataclass_fields__)


def test_hardening_flags():
    _, server = _configs(
        "--limit-concurrency", "100",
        "--header-timeout", "3",
        "--body-timeout", "7.5",
        "--engine-stall-timeout", "4",
        "--engine-step-timeout", "0",
        "--request-timeout", "120",
        "--max-prompts-per-request", "8",
    )  # fmt: skip
    assert server.limit_concurrency == 100 and server.header_timeout == 3 and server.body_timeout == 7.5
    assert server.engine_stall_timeout == 4 and server.engine_step_timeout is None
    assert server.request_timeout == 120 and server.max_prompts_per_request == 8
    _, defaults = _configs()
    assert defaults.limit_concurrency == 4096 and defaults.request_timeout is None
    assert _configs("--limit-concurrency", "0")[1].limit_concurrency is None


@pytest.mark.parametrize("argv", [["--bogus-flag"], ["--header-timeout", "-1"], ["--max-n", "x"]])
def test_a_bad_flag_is_one_line(argv, capsys):
    """As for ``brisk generate``: one ``brisk serve: error:`` line, not the whole usage text."""
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["serve", *argv])
    assert exc.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("brisk serve: error: "), lines


def test_serving_takes_a_smaller_step_budget_on_gpus():
    """A 16,384-token prefill step beside running decodes stalls every stream: serving halves it on GPUs."""
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert default_max_num_batched_tokens(gpu, serving=False) == 16384
    assert default_max_num_batched_tokens(gpu, serving=True) == 8192
    assert default_max_num_batched_tokens(cpu, serving=False) == default_max_num_batched_tokens(cpu, True) == 2048
