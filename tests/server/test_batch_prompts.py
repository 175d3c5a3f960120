"""A list of prompts reaches the engine as one batch: one message, one wait for all to be accepted, so the
engine schedules them together instead of receiving them one round trip (and about one step) at a time."""

from __future__ import annotations

from tests.server.conftest import MODEL_NAME

NUM_PROMPTS = 300


def test_prompt_list_is_one_batch(server):
    prompts = [f"prompt number {i}" for i in range(NUM_PROMPTS)]
    steps_before = server.metrics()["brisk:engine_steps_total"]
    with server.client() as http:
        r = http.post(
            "/v1/completions",
            json={"model": MODEL_NAME, "prompt": prompts, "max_tokens": 1, "temperature": 0, "ignore_eos": True},
        )
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == list(range(NUM_PROMPTS))
    assert all(c["finish_reason"] == "length" for c in choices)
    # 300 short prompts fit two steps of 256 sequences; submitted one by one they took about one step each.
    steps = server.metrics()["brisk:engine_steps_total"] - steps_before
    assert steps <= 10, steps


def test_prompt_list_results_match_single_requests(server):
    prompts = ["The capital of France", "Once upon a time", "1, 2, 3,"]
    body = {"model": MODEL_NAME, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    with server.client() as http:
        batched = http.post("/v1/completions", json={**body, "prompt": prompts}).json()["choices"]
        alone = [http.post("/v1/completions", json={**body, "prompt": p}).json()["choices"][0] for p in prompts]
    assert [c["text"] for c in batched] == [c["text"] for c in alone]
