"""``speculative_config`` validation and the ``--speculative-config`` / ``--speculative-disable-by-batch-size``
flags of ``brisk serve``, ``brisk bench`` and ``brisk generate`` (parsing only; nothing is loaded)."""

import pytest

from brisk.config import EngineArgs
from brisk.entrypoints.cli import common
from brisk.entrypoints.cli.main import build_parser
from brisk.entrypoints.cli.serve import build_configs
from brisk.spec_decode.config import SpeculativeConfig

NGRAM = '{"method": "ngram", "num_speculative_tokens": 3}'
DRAFT = {"method": "draft_model", "model": "x", "num_speculative_tokens": 2}


def test_defaults_and_vllm_window_rule():
    config = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 4})
    assert (config.prompt_lookup_min, config.prompt_lookup_max, config.disable_by_batch_size) == (2, 5, 2)
    assert config.is_active(1) and not config.is_active(2)  # the measured default: batch 1 only
    always = {"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": None}
    assert SpeculativeConfig.from_dict(always).is_active(256)  # null: vLLM's default, every batch size
    only_max = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (3, 3)
    limited = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 4})
    assert limited.is_active(3) and not limited.is_active(4)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"method": "medusa", "num_speculative_tokens": 2}, "method"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "exceeds"),
        ({"method": "ngram", "num_speculative_tokens": 2, "num_lookahead": 2}, "num_lookahead"),
        ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0}, "disable_by_batch_size"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model'"),
        ({"method": "ngram", "model": "x", "num_speculative_tokens": 2}, "takes no 'model'"),
        ({"method": "ngram", "quantization": "fp8", "num_speculative_tokens": 2}, "takes no 'quantization'"),
        ({"method": "draft_model", "model": "x", "quantization": 8, "num_speculative_tokens": 2}, "'quantization'"),
        ({"method": "draft_model", "model": "x", "revision": 1, "num_speculative_tokens": 2}, "'revision'"),
        ({"method": "draft_model", "model": "x", "max_model_len": 0, "num_speculative_tokens": 2}, "'max_model_len'"),
        ({"method": "draft_model", "model": "x", "draft_sample_method": "top", "num_speculative_tokens": 2},
         r"draft_sample_method'\] must be one of"),
        ({**DRAFT, "draft_tensor_parallel_size": 2}, r"\['draft_tensor_parallel_size'\]=2 asks for what"),
        ({**DRAFT, "rejection_sample_method": "block"}, r"\['rejection_sample_method'\]='block' asks for what"),
        ({**DRAFT, "parallel_drafting": True}, "'parallel_drafting'"),
        ({**DRAFT, "kv_cache_dtype": "fp8"}, "'kv_cache_dtype'"),
        ({**DRAFT, "target_model_config": None}, "unknown fields"),
    ],
)
def test_bad_configs_name_the_field(config, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(model="m", speculative_config=config).validate()


def test_vllm_fields_that_ask_for_nothing_are_accepted():
    """A config written for vLLM runs: its fields for what brisk does not do are accepted at values that ask for
    nothing (vLLM's defaults, one draft rank), and those brisk does are read."""
    vllm_config = {**DRAFT, "draft_tensor_parallel_size": 1, "enforce_eager": None, "kv_cache_dtype": "auto",
                   "disable_padded_drafter_batch": True, "use_local_argmax_reduction": False,
                   "rejection_sample_method": "standard", "suffix_decoding_max_tree_depth": 24,
                   "num_speculative_tokens_per_batch_size": None, "revision": "main", "max_model_len": 4096,
                   "draft_sample_method": "probabilistic", "quantization": "fp8"}  # fmt: skip
    config = SpeculativeConfig.from_dict(vllm_config)
    assert (config.revision, config.max_model_len, config.draft_sample_method, config.quantization) == (
        "main", 4096, "probabilistic", "fp8")  # fmt: skip
    assert SpeculativeConfig.from_dict(DRAFT).draft_sample_method == "greedy"  # vLLM's default


def test_a_non_dict_is_refused():
    with pytest.raises(ValueError, match="speculative_config must be a dict"):
        EngineArgs(model="m", speculative_config="ngram").validate()


def test_serve_flags(monkeypatch):
    monkeypatch.delenv("BRISK_API_KEY", raising=False)
    args = build_parser().parse_args(
        ["serve", "m", "--speculative-config", NGRAM, "--speculative-disable-by-batch-size", "8"]
    )
    engine, _ = build_configs(args)
    assert engine.speculative_config == {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 8}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", "--speculative-config", "[1, 2]"])


def test_generate_and_bench_flags():
    args = build_parser().parse_args(["generate", "hi", "--model", "m", "--speculative-config", NGRAM])
    assert common.engine_args_from_args(args).speculative_config == {"method": "ngram", "num_speculative_tokens": 3}
    args = build_parser().parse_args(["generate", "hi", "--model", "m", "--speculative-disable-by-batch-size", "2"])
    with pytest.raises(ValueError, match="needs --speculative-config"):
        common.engine_args_from_args(args)
    args = build_parser().parse_args(["bench", "latency", "--model", "m", "--speculative-config", NGRAM])
    from brisk.bench.common import engine_kwargs

    assert engine_kwargs(args)["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3}


def test_bench_latency_reports_speculation(tmp_path):
    """``brisk bench latency --speculative-config`` on a config-only llama (random weights) reports the drafts."""
    import json

    from brisk.bench import configs
    from brisk.entrypoints.cli.main import main

    model = str(configs.write_config_folder(tmp_path / "tiny", "llama-tiny-shape"))
    out = tmp_path / "result.json"
    argv = ["bench", "latency", "--model", model, "--load-format", "dummy", "--device", "cpu"]
    argv += ["--kv-cache-memory-bytes", "16MiB", "--num-iters", "1", "--input-len", "32", "--output-len", "16"]
    # At every batch size: the warm-up's batch of 4 is where this random model's drafts come from.
    config = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "disable_by_batch_size": None}
    assert main([*argv, "--speculative-config", json.dumps(config), "--output-json", str(out)]) == 0
    spec = json.loads(out.read_text())["results"]["brisk"]["engine"]["spec_decode"]
    assert spec["num_draft_tokens"] >= spec["num_accepted_tokens"] >= 0 and spec["num_drafts"] > 0
    assert spec["mean_acceptance_length"] == round(1 + spec["num_accepted_tokens"] / spec["num_drafts"], 3)
