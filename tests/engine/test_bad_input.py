"""Bad input raises errors that say what to change, and leaves the engine usable."""

import pytest

from brisk import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, device="cpu", max_model_len=64)


@pytest.mark.parametrize(
    "prompts, match",
    [
        ([], "non-empty"),
        ("", "empty"),
        ([[]], "empty"),
        ("word " * 100, "max_model_len is 64"),
        ([[10**9]], "outside the vocabulary"),
        ([1.5], "string, a list of integer"),
        ({"prompt_token_ids": [1, 2], "multi_modal_data": {"image": "x"}}, r"\['multi_modal_data'\] are not"),
        ({"prompt_token_ids": "1 2"}, '"prompt_token_ids" must be a list'),
        ({"prompt": 3}, '"prompt" must be a string'),
        ([{"cache_salt": None}], 'needs "prompt"'),
    ],
)
def test_bad_prompts(llm, prompts, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(prompts, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.kv_cache_manager.num_free_blocks == llm.engine.kv_cache_manager.pool.num_blocks


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"top_k": 2**63}, "top_k"),
        ({"stop_token_ids": [2**63]}, "stop_token_ids"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**63 - 1, "n": 2}, "seed"),
        ({"min_p": 2}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"n": 10**6}, "n"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"presence_penalty": 9}, "presence_penalty"),
        ({"frequency_penalty": -9}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logprobs": 1000}, "logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"seed": "x"}, "seed"),
        ({"max_tokens": True}, "max_tokens"),
    ],
)
def test_bad_sampling_params(kwargs, field):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "params, match",
    [({"temperature": 0}, "got dict"), ([{"temperature": 0}], "got a list holding dict")],
)
def test_sampling_params_of_another_type(llm, params, match):
    with pytest.raises(ValueError, match=f"sampling_params must be a SamplingParams or a list of them, {match}"):
        llm.generate("a", params, use_tqdm=False)


@pytest.mark.parametrize(
    "messages",
    [{"role": "user", "content": "x"}, "hello", [], [{"content": "x"}], [[{"role": "user"}]], [["hi"]]],
)
def test_chat_messages_of_another_shape(llm, messages):
    with pytest.raises(ValueError, match="messages must be one conversation"):
        llm.chat(messages, use_tqdm=False)


def test_mismatched_params_list(llm):
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate(["a", "b"], [SamplingParams(), SamplingParams(), SamplingParams()], use_tqdm=False)


def test_unknown_model_path():
    with pytest.raises(FileNotFoundError):
        LLM("/nonexistent/model/folder", device="cpu")


def test_unknown_engine_argument(tiny_llama):
    with pytest.raises(TypeError, match="unknown arguments"):
        LLM(tiny_llama, device="cpu", max_num_seq=4)


def test_kv_cache_too_small_says_what_to_change(tiny_llama):
    with pytest.raises(ValueError, match="Raise kv_cache_memory_bytes, or lower max_model_len"):
        LLM(tiny_llama, device="cpu", kv_cache_memory_bytes=4096, max_model_len=512)


def test_unsupported_architecture(tmp_path, tiny_llama):
    import json
    import shutil

    shutil.copytree(tiny_llama, tmp_path / "m", dirs_exist_ok=True)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["architectures"] = ["FancyNewForCausalLM"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="Supported architectures: LlamaForCausalLM"):
        LLM(str(tmp_path / "m"), device="cpu")


def test_max_model_len_too_large(tiny_llama):
    with pytest.raises(ValueError, match="max_position_embeddings"):
        LLM(tiny_llama, device="cpu", max_model_len=10**6)


def test_still_works_after_errors(llm):
    out = llm.generate("Paris is", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_sliding_window_model_needs_short_max_model_len(tiny_model_factory):
    from tests.engine.test_hf_parity import hf_greedy

    folder = tiny_model_factory("mistral")
    with pytest.raises(ValueError, match="sliding-window attention .window 48.*max_model_len <= 48"):
        LLM(folder, device="cpu")
    llm = LLM(folder, device="cpu", max_model_len=48)  # within the window, full attention is exact
    prompts = ["The quick brown fox", "Paris is"]
    params = SamplingParams(temperature=0, max_tokens=8)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == hf_greedy(folder, prompts, max_tokens=8)


def test_flashinfer_backend_needs_a_gpu_and_half_precision(tiny_llama):
    """Checked before anything is loaded, whether or not flashinfer is installed."""
    with pytest.raises(ValueError, match="'flashinfer' runs on CUDA GPUs in float16 or bfloat16 .got cpu, float32"):
        LLM(tiny_llama, device="cpu", attention_backend="flashinfer")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_num_seqs": "4"}, "max_num_seqs must be an integer, got '4'"),
        ({"seed": None}, "seed must be an integer"),
        ({"seed": 2**70}, "seed must be in"),
        ({"max_model_len": 64.5}, "max_model_len must be an integer"),
        ({"block_size": True}, "block_size must be an integer, got True"),
        ({"enable_prefix_caching": "false"}, "enable_prefix_caching must be True or False"),
        ({"gpu_memory_utilization": "0.5"}, "gpu_memory_utilization must be a number"),
        ({"device": "mps"}, "device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'mps'"),
        ({"device": "tpu"}, "device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"),
        ({"gpu_memory_utilization": 0.5}, "on the CPU set kv_cache_memory_bytes"),
    ],
)
def test_bad_engine_arguments_name_the_field(tiny_llama, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(tiny_llama, **{"device": "cpu", **kwargs})


def test_tokenizer_that_was_asked_for_must_load(tiny_llama, tmp_path):
    """With random weights a model folder may lack a tokenizer (prompts are token ids), but a tokenizer that was
    named must load. A missing folder, or one without tokenizer files, is refused before the weights load (the
    tokenizer loads on a thread meanwhile): its error comes ahead of a KV cache too small to start."""
    too_small = {"device": "cpu", "load_format": "dummy", "kv_cache_memory_bytes": 1000}
    with pytest.raises(ValueError, match="Cannot load a tokenizer from .*missing: no such folder"):
        LLM(tiny_llama, tokenizer=str(tmp_path / "missing"), **too_small)
    with pytest.raises(ValueError, match="Cannot load a tokenizer from .*: it holds none of tokenizer.json"):
        LLM(tiny_llama, tokenizer=str(tmp_path), **too_small)
    assert LLM(tiny_llama, device="cpu", load_format="dummy").engine.tokenizer is not None


def test_stop_token_ids_outside_the_vocabulary(llm):
    """min_tokens bans stop ids by indexing the logits: an id past the vocabulary is refused up front."""
    params = SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=[10**6])
    with pytest.raises(ValueError, match="Token id 1000000 in stop_token_ids is outside the vocabulary"):
        llm.generate("Paris is", params, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests() and not llm.engine._child_to_parent


def test_request_ids_of_n_sequences_cannot_collide(llm):
    """A request of n sequences names them "{index}_{request_id}": an id that another request's sequence has is
    refused, in either order, and nothing is left behind."""
    engine = llm.engine
    params = SamplingParams(max_tokens=2)
    engine.add_request("1_a", [5, 6], params)
    with pytest.raises(ValueError, match="request_id 'a' is already in use \\(by '1_a'\\)"):
        engine.add_request("a", [5, 6], SamplingParams(n=2, max_tokens=2))
    engine.add_request("b", [5, 6], SamplingParams(n=2, max_tokens=2))
    with pytest.raises(ValueError, match="request_id '0_b' is already in use"):
        engine.add_request("0_b", [5, 6], params)
    while engine.has_unfinished_requests():
        engine.step()
    assert not engine._child_to_parent and not engine.scheduler.requests


def test_vllm_prompt_dicts(llm):
    """vLLM's TextPrompt and TokensPrompt dicts (what its offline users pass) give what text and ids give; empty
    extra fields ask for nothing, and a TokensPrompt's text is reported as the output's prompt."""
    greedy = SamplingParams(max_tokens=4, temperature=0)
    ids = llm.get_tokenizer().encode("hello world", add_special_tokens=True)
    expected = llm.generate(["hello world"], greedy, use_tqdm=False)[0]
    outputs = llm.generate(
        [
            {"prompt": "hello world"},
            {"prompt_token_ids": ids, "multi_modal_data": None},
            {"prompt_token_ids": ids, "prompt": "hello world", "cache_salt": None},
            {"prompt": "hello world", "prompt_token_ids": None},
        ],
        greedy,
        use_tqdm=False,
    )
    for out in outputs:
        assert out.prompt_token_ids == ids and out.outputs[0].token_ids == expected.outputs[0].token_ids
    assert [out.prompt for out in outputs] == ["hello world", None, "hello world", "hello world"]
    single = llm.generate({"prompt_token_ids": ids}, greedy, use_tqdm=False)
    assert single[0].outputs[0].token_ids == expected.outputs[0].token_ids
