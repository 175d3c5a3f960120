"""Sampling defaults from the model's ``generation_config.json`` (vLLM's ``generation_config="auto"``): requests that
leave a field out take the model creator's value, offline and on the real server; ``"vllm"`` keeps the neutral
defaults; a field the request sets wins."""

from __future__ import annotations

import json
import shutil

import pytest

from brisk import LLM, SamplingParams
from brisk.engine.generation_defaults import default_sampling_fields
from tests.server.conftest import MODEL_NAME, ServerProcess

# top_k 1 makes sampling greedy, so the defaults show in the tokens; max_new_tokens caps what is left unset.
RECOMMENDED = {"do_sample": True, "temperature": 0.7, "top_k": 1, "max_new_tokens": 5}
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def recommending(tiny_llama, tmp_path_factory) -> str:
    """The tiny Llama with sampling defaults in its generation_config.json."""
    folder = tmp_path_factory.mktemp("generation-defaults") / "model"
    shutil.copytree(tiny_llama, folder)
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**config, **RECOMMENDED}))
    return str(folder)


def test_fields_that_differ_from_transformers_defaults(recommending, tiny_llama, tmp_path):
    assert default_sampling_fields(recommending) == {"temperature": 0.7, "top_k": 1, "max_tokens": 5}
    assert default_sampling_fields(tiny_llama) == {}
    assert default_sampling_fields(recommending, "vllm") == {}
    assert default_sampling_fields(tiny_llama, recommending) == {"temperature": 0.7, "top_k": 1, "max_tokens": 5}
    with pytest.raises(ValueError, match="holds no generation_config.json"):
        default_sampling_fields(tiny_llama, str(tmp_path))
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_p": 1.5}))
    with pytest.raises(ValueError, match="recommends sampling values brisk cannot use .*top_p"):
        default_sampling_fields(tiny_llama, str(tmp_path))
    (tmp_path / "generation_config.json").write_text("[1]")
    with pytest.raises(ValueError, match="is not a JSON object"):
        default_sampling_fields(tiny_llama, str(tmp_path))
    # Every field written counts, one equal to an old transformers default too (vLLM 0.26 reads it so).
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": 50, "temperature": 1.0}))
    assert default_sampling_fields(tiny_llama, str(tmp_path)) == {"temperature": 1.0, "top_k": 50}


def test_offline_requests_without_sampling_params_take_them(recommending):
    llm = LLM(recommending, device="cpu")
    assert llm.get_default_sampling_params().top_k == 1
    greedy = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    defaults = llm.generate([PROMPT], use_tqdm=False)[0].outputs[0].token_ids
    assert defaults == greedy[0].outputs[0].token_ids[: len(defaults)] and 0 < len(defaults) <= 5
    neutral = LLM(recommending, device="cpu", generation_config="vllm").get_default_sampling_params()
    assert (neutral.top_k, neutral.temperature, neutral.max_tokens) == (0, 1.0, 16)


def test_the_server_fills_in_what_a_request_leaves_out(recommending):
    server = ServerProcess(recommending)
    try:
        assert "take these sampling defaults" in server.logs()
        with server.client() as client:
            def chat(**fields) -> tuple[str, int]:
                body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": PROMPT}], "ignore_eos": True}
                reply = client.post("/v1/chat/completions", json={**body, **fields})
                assert reply.status_code == 200, reply.text
                return reply.json()["choices"][0]["message"]["content"], reply.json()["usage"]["completion_tokens"]

            greedy = chat(temperature=0, max_tokens=5)
            assert chat(seed=1) == greedy  # top_k 1 and 5 tokens, from the model's generation_config.json
            # A field the request sets wins: top_k 0 samples at temperature 0.7 again, max_tokens 12 is honoured.
            replies = {chat(top_k=0, max_tokens=12, seed=s) for s in range(4)}
            assert len(replies) > 1 and {n for _, n in replies} == {12}
    finally:
        server.stop()
