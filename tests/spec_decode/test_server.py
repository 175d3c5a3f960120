"""``brisk serve --speculative-config``: a real server on loopback and the unmodified ``openai`` client. Streamed
text equals the non-streamed text (and the offline engine's), and ``/metrics`` counts exactly the drafts that the
offline engine reports per request for the same prompts."""

import json

import openai
import pytest

from brisk import LLM, SamplingParams
from tests.engine.test_equivalence import prompts_with_shared_prefix
from tests.server.conftest import ServerProcess
from tests.spec_decode.test_greedy_equivalence import NGRAM  # at every batch size

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def spec_server(tiny_llama):
    server = ServerProcess(tiny_llama, "--speculative-config", json.dumps(NGRAM), api_key=None)
    yield server
    server.stop()


def test_streaming_text_and_metrics(tiny_llama, spec_server):
    offline = LLM(tiny_llama, device="cpu", max_model_len=512, speculative_config=NGRAM)
    prompts = prompts_with_shared_prefix(offline.get_tokenizer(), count=3)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [offline.generate([p], params, use_tqdm=False)[0] for p in prompts]  # one at a time, as below

    client = openai.OpenAI(base_url=f"{spec_server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    for prompt, want in zip(prompts, expected):
        kwargs = dict(model="tiny-llama", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                      extra_body={"ignore_eos": True})  # fmt: skip
        whole = client.completions.create(**kwargs).choices[0].text
        streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(stream=True, **kwargs))
        assert streamed == whole == want.outputs[0].text

    metrics = spec_server.metrics()
    twice = 2  # each prompt ran streamed and not
    for name, field in [
        ("spec_decode_num_drafts", "num_spec_steps"),
        ("spec_decode_num_draft_tokens", "num_draft_tokens"),
        ("spec_decode_num_accepted_tokens", "num_accepted_tokens"),
    ]:
        assert metrics[f"brisk:{name}_total"] == twice * sum(getattr(o.metrics, field) for o in expected), name
    accepted, proposed = (metrics[f"brisk:spec_decode_num_{k}_tokens_total"] for k in ("accepted", "draft"))
    assert 0 < accepted < proposed
