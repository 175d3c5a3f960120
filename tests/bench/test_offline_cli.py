"""`brisk bench throughput / latency / long-context / startup` end to end on a tiny config-only llama (random
weights, CPU)."""

import importlib.util
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


def test_latency_w3_shape_with_other_runs_is_not_w3(tmp_path):
    """W3's lengths with 2 runs draw other 1-token prompts than the recipe's 3: not W3, so no peer ratio."""
    peer = tmp_path / "peer.json"
    peer.write_text(json.dumps({"W3": {"decode_tok_s_median": 100.0}}))
    data = _run(["bench", "latency", "--model", "llama-tiny-shape", "--num-iters", "2", "--peer-json", str(peer), *CPU],
                tmp_path)  # fmt: skip
    assert data["workload"]["name"] == "latency-custom" and data["ratios"] == {}


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


def test_startup_errors_say_what_to_change(capfd):
    assert main(["bench", "startup", "--model", "llama-tiny-shape", "--prompt-len", "5000", *CPU]) == 1
    err = capfd.readouterr().err
    assert "brisk bench: error: The prompt has 5000 tokens but max_model_len is 4096" in err
    assert "Traceback" not in err


def test_startup(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    data = _run(["bench", "startup", "--model", "llama-tiny-shape", *CPU], tmp_path)
    r = data["results"]["brisk"]
    run = r["runs"][0]
    assert run["generated_tokens"] == 1 and run["device"] == "cpu"
    assert 0 < run["engine_init_s"] < run["startup_s"] < run["process_wall_s"]
    assert run["import_s"] > 0 and r["startup_s_median"] == run["startup_s"]
    phases = run["engine_phases_s"]  # on the CPU: no warm-up; the phases account for (nearly) all of the init
    assert list(phases) == ["config", "weights", "KV cache", "step buffers and CUDA graphs", "tokenizer"]
    # A loaded machine spent up to 0.06 s of a 0.09 s init outside the phases (argument checks, the executor).
    assert 0.9 * run["engine_init_s"] - 0.1 < sum(phases.values()) <= run["engine_init_s"]


def test_bad_arguments_fail_cleanly(capsys):
    assert main(["bench", "throughput", "--model", "llama-tiny-shape", "--workload", "W1", "--input-len", "9"]) == 1
    assert "W1 has its own input lengths" in capsys.readouterr().err


def test_hf_backend_never_stops_at_eos(config_only_llama, tmp_path):
    """A model whose EOS is the first token it generates for a prompt still gives that row every requested token
    (a shape check alone would miss one row padded after an early EOS while another row runs on)."""
    import shutil

    from brisk.bench.backends import HFBackend

    alone = HFBackend(config_only_llama, device="cpu", load_format="dummy")._generate_batch([[5, 6, 7]], 4, 0.0)[0]
    folder = tmp_path / "eos"
    shutil.copytree(config_only_llama, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": int(alone[0])}))
    backend = HFBackend(str(folder), device="cpu", load_format="dummy", batch_size=2)  # same seed: same weights
    batch = backend._generate_batch([[5, 6, 7], [8, 9]], 4, 0.0)
    assert batch[0].tolist() == alone.tolist()  # ran on past its EOS, as alone
    result = backend.run([[5, 6, 7]], [4], 0.0)  # stopping at EOS would leave 1 token: an error
    assert result.output_counts == [4] and result.generated_tokens == 4


def test_hf_backend_flags(config_only_llama, tmp_path, capsys):
    argv = ["bench", "throughput", "--model", config_only_llama, "--load-format", "dummy", "--workload", "W2"]
    small = ["--num-prompts", "2", "--input-len", "8", "--output-len", "2", "--device", "cpu"]
    # Flags of brisk's engine alone are an error for HF alone (it would ignore them) ...
    assert main([*argv, *small, "--backend", "hf", "--block-size", "32", "--max-num-seqs", "4"]) == 1
    assert "--backend hf does not take --block-size, --max-num-seqs" in capsys.readouterr().err
    # ... and --hf-batch-size for brisk alone.
    assert main([*argv, *small, "--hf-batch-size", "2"]) == 1
    assert "use it with --backend hf or both" in capsys.readouterr().err
    # --max-model-len applies to HF too.
    assert main([*argv, *small, "--backend", "hf", "--max-model-len", "9"]) == 1
    assert "max_model_len is 9" in capsys.readouterr().err
    # With both, brisk takes them and HF's result says it did not.
    data = _run([*argv, *small, "--backend", "both", "--block-size", "32", "--hf-batch-size", "2"], tmp_path)
    assert data["results"]["hf"]["engine"]["brisk_only_flags_not_applied"] == ["--block-size"]
    assert data["results"]["brisk"]["engine"]["block_size"] == 32 and data["config"]["hf_batch_size"] == 2


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_backend_without_vllm(config_only_llama, tmp_path, capsys):
    """--backend vllm drives an installed vLLM; without one, each way of asking for it says so, and brisk's own
    figure beside it still comes back."""
    argv = ["bench", "throughput", "--model", config_only_llama, "--load-format", "dummy", "--workload", "W2"]
    small = ["--num-prompts", "2", "--input-len", "8", "--output-len", "2"]
    assert main([*argv, *small, "--backend", "vllm"]) == 1
    assert "--backend vllm needs vLLM installed" in capsys.readouterr().err
    small.extend(["--device", "cpu"])
    # vLLM alone refuses brisk-only flags (--device: vLLM picks its platform), and bad names are usage errors.
    assert main([*argv, *small, "--backend", "vllm", "--block-size", "32"]) == 1
    assert "--backend vllm does not take --device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, *small, "--backend", "brisk,sglang"])
    out = tmp_path / "r.json"
    assert main([*argv, *small, "--backend", "brisk,vllm", "--block-size", "32", "--output-json", str(out)]) == 1
    data = json.loads(out.read_text())
    assert data["results"]["brisk"]["output_tokens"] == 4 and data["results"]["brisk"]["engine"]["block_size"] == 32
    assert "needs vLLM installed" in data["results"]["vllm"]["error"]
    assert data["ratios"] == {"brisk_over_vllm_output_tok_s": None}


def test_backend_errors_in_child_processes_are_reported(config_only_llama, tmp_path, capfd):
    argv = ["bench", "latency", "--model", config_only_llama, "--load-format", "dummy", "--device", "cpu"]
    out = tmp_path / "r.json"
    assert main([*argv, "--backend", "both", "--max-model-len", "8", "--output-json", str(out)]) == 1
    data = json.loads(out.read_text())
    for name in ("brisk", "hf"):
        assert "exceeds max_model_len 8" in data["results"][name]["error"]
    assert "Traceback" not in capfd.readouterr().err  # the children's output too


def test_bad_peer_json_fails_before_running(config_only_llama, tmp_path, capsys):
    argv = ["bench", "latency", "--model", config_only_llama, "--load-format", "dummy", "--device", "cpu"]
    assert main([*argv, "--peer-json", str(tmp_path / "missing.json")]) == 1
    assert "missing.json" in capsys.readouterr().err


def test_write_config(tmp_path, tiny_llama):
    out = tmp_path / "serve-model"
    assert main(["bench", "write-config", "llama-3.1-8b-shape-smollm2-vocab", str(out), "--tokenizer", tiny_llama]) == 0
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 49152
    assert (out / "tokenizer.json").is_file()
