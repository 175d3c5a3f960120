"""`brisk bench throughput / latency / long-context / startup` end to end on a tiny config-only llama (random
weights, CPU)."""

import json

import pytest

from brisk.bench import configs
from brisk.entrypoints.cli.main import main

CPU = ["--device", "cpu", "--kv-cache-memory-bytes", "16MiB"]


@pytest.fixture(scope="module")
def config_only_llama(tmp_path_factory):
    """A folder holding only config.json (vocab 10240 so the workloads' ids [0, 10000) fit)."""
    return str(configs.write_config_folder(tmp_path_factory.mktemp("cfg") / "tiny", "llama-tiny-shape"))


def _run(argv, tmp_path):
    out = tmp_path / "result.json"
    assert main([*argv, "--output-json", str(out)]) == 0
    return json.loads(out.read_text())


def _check_common(data, bench):
    assert data["bench"] == bench and data["schema_version"] == 1
    for key in ("command", "args", "date", "device_name", "brisk_commit", "torch", "transformers", "config"):
        assert key in data
    assert data["device_name"] == "cpu"


def test_throughput_w1(config_only_llama, tmp_path):
    argv = ["bench", "throughput", "--model", config_only_llama, "--load-format", "dummy", "--workload", "W1"]
    data = _run([*argv, "--num-prompts", "4", "--output-len", "4", *CPU], tmp_path)
    _check_common(data, "throughput")
    w = data["workload"]
    assert w["requests"] == 4 and w["output_tokens"] == 16 and w["temperature"] == 0.6
    assert w["fingerprint_expected"] is None and w["fingerprint_ok"] is None
    r = data["results"]["brisk"]
    assert r["output_tokens"] == r["output_tokens_expected"] == 16 and r["exact_lengths"]
    assert r["input_tokens"] == w["input_tokens"] > 400
    assert r["output_tok_s"] > 0 and r["total_tok_s"] > r["output_tok_s"] and r["req_s"] > 0 and r["wall_s"] > 0
    assert r["engine"]["attention_backend"] == "torch" and r["warmup_s"] > 0


def test_throughput_hf_backend(config_only_llama, tmp_path):
    argv = ["bench", "throughput", "--model", config_only_llama, "--load-format", "dummy", "--workload", "W2"]
    argv += ["--num-prompts", "3", "--input-len", "16", "--output-len", "5", "--backend", "hf"]
    data = _run([*argv, "--hf-batch-size", "2", "--device", "cpu"], tmp_path)
    r = data["results"]["hf"]
    assert r["output_tokens"] == 15 and r["exact_lengths"] and r["output_tok_s"] > 0
    assert r["engine"]["hf_batch_size"] == 2 and r["engine"]["random_weights"] is True


def test_latency(tmp_path):
    argv = ["bench", "latency", "--model", "llama-tiny-shape", "--input-len", "16", "--output-len", "8"]
    data = _run([*argv, "--num-iters", "2", *CPU], tmp_path)
    _check_common(data, "latency")
    r = data["results"]["brisk"]
    assert r["runs"] == 2 and r["output_tokens"] == [8, 8] and r["exact_lengths"]
    assert r["decode_tok_s_median"] > 0 and len(r["wall_1tok_s"]) == 2 and r["ttft_ms_median"] > 0
    assert r["engine_decode_tok_s_median"] > 0 and r["engine"]["max_model_len"] == 4096
    assert data["workload"]["name"] == "latency-custom"


def test_latency_batch(tmp_path):
    argv = ["bench", "latency", "--model", "llama-tiny-shape", "--input-len", "8", "--output-len", "4"]
    data = _run([*argv, "--num-iters", "1", "--batch-size", "3", *CPU], tmp_path)
    r = data["results"]["brisk"]
    assert r["batch_size"] == 3 and r["output_tokens"] == [12] and r["exact_lengths"]


def test_long_context(config_only_llama, tmp_path):
    argv = ["bench", "long-context", "--model", config_only_llama, "--load-format", "dummy"]
    data = _run([*argv, "--input-len", "100", "--output-len", "6", "--batch-sizes", "1", "3", *CPU], tmp_path)
    _check_common(data, "long-context")
    w = data["workload"]
    assert w["name"] == "W4-custom" and w["batch_sizes"] == [1, 3] and w["seed"] == 3
    assert data["config"]["engine_args"]["max_model_len"] == 106  # input + output, when not given
    batches = data["results"]["brisk"]["batches"]
    assert list(batches) == ["bs1", "bs3"]
    for bs in (1, 3):
        r = batches[f"bs{bs}"]
        assert r["batch_size"] == bs and r["output_tokens"] == 6 * bs and r["exact_lengths"]
        # The prefill requests left every full block of their first 99 ids cached: 6 blocks of 16 tokens.
        assert r["prefix_hit_tokens"] == [96] * bs
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0
    assert data["ratios"] == {}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--no-enable-prefix-caching"], "leave prefix caching on"),
        (["--max-model-len", "50"], "exceeds --max-model-len 50"),
        (["--batch-sizes", "2", "2"], "must differ"),
        (["--input-len", "1"], "--input-len must be >= 2"),
    ],
)
def test_long_context_bad_arguments(config_only_llama, extra, message, capsys):
    argv = ["bench", "long-context", "--model", config_only_llama, "--load-format", "dummy", "--input-len", "40"]
    assert main([*argv, *extra, *CPU]) == 1
    assert message in capsys.readouterr().err


def test_startup(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    data = _run(["bench", "startup", "--model", "llama-tiny-shape", *CPU], tmp_path)
    r = data["results"]["brisk"]
    run = r["runs"][0]
    assert run["generated_tokens"] == 1 and run["device"] == "cpu"
    assert 0 < run["engine_init_s"] < run["startup_s"] < run["process_wall_s"]
    assert run["import_s"] > 0 and r["startup_s_median"] == run["startup_s"]
    phases = run["engine_phases_s"]  # on the CPU: no warm-up; the phases account for (nearly) all of the init
    assert list(phases) == ["config and tokenizer", "weights", "KV cache", "step buffers and CUDA graphs"]
    assert 0.9 * run["engine_init_s"] - 0.05 < sum(phases.values()) <= run["engine_init_s"]


def test_bad_arguments_fail_cleanly(capsys):
    assert main(["bench", "throughput", "--model", "llama-tiny-shape", "--workload", "W1", "--input-len", "9"]) == 1
    assert "W1 has its own input lengths" in capsys.readouterr().err


def test_hf_backend_never_stops_at_eos(config_only_llama):
    from brisk.bench.backends import HFBackend

    backend = HFBackend(config_only_llama, device="cpu", load_format="dummy", batch_size=2)
    # No EOS in the generation config: no row can finish early, so every request gets its exact length
    # (a shape check alone would miss one row padded after an early EOS while another row runs on).
    assert backend.model.generation_config.eos_token_id is None
    result = backend.run([[5, 6, 7], [8, 9]], [4, 4], 0.0)
    assert result.output_counts == [4, 4] and result.generated_tokens == 8


def test_write_config(tmp_path, tiny_llama):
    out = tmp_path / "serve-model"
    assert main(["bench", "write-config", "llama-3.1-8b-shape-smollm2-vocab", str(out), "--tokenizer", tiny_llama]) == 0
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 49152
    assert (out / "tokenizer.json").is_file()
