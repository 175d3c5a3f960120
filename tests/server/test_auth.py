"""API key matrix: every route with no key, a wrong key and the right key; /health never needs one."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import API_KEY, MODEL_NAME

ROUTES = [
    ("GET", "/v1/models", None),
    ("GET", f"/v1/models/{MODEL_NAME}", None),
    ("POST", "/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("POST", "/tokenize", {"prompt": "hi"}),
    ("POST", "/detokenize", {"tokens": [5, 6]}),
    ("GET", "/metrics", None),
    ("GET", "/openapi.json", None),
    ("GET", "/docs", None),
    ("GET", "/version", None),
]
IDS = [f"{m} {p}" + (" stream" if body and body.get("stream") else "") for m, p, body in ROUTES]


def _request(server, method, path, body, headers):
    return httpx.request(method, server.url + path, json=body, headers=headers, timeout=30)


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=IDS)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-key"},
        {"Authorization": f"Basic {API_KEY}"},
        {"Authorization": f"Bearer {API_KEY}x"},
        {"Authorization": API_KEY},
    ],
    ids=["no-key", "wrong-key", "wrong-scheme", "key-prefix", "no-scheme"],
)
def test_rejected_without_the_right_key(server, method, path, body, headers):
    r = _request(server, method, path, body, headers)
    assert r.status_code == 401, r.text
    error = r.json()["error"]
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    assert API_KEY not in r.text


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=IDS)
def test_accepted_with_the_right_key(server, method, path, body):
    r = _request(server, method, path, body, {"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200, r.text
    lower = _request(server, method, path, body, {"authorization": f"bearer {API_KEY}"})
    assert lower.status_code == 200


def test_health_needs_no_key(server):
    for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": f"Bearer {API_KEY}"}):
        r = httpx.get(f"{server.url}/health", headers=headers, timeout=10)
        assert r.status_code == 200


def test_unknown_route_without_key_is_401_not_404(server):
    assert httpx.get(f"{server.url}/v1/secret", timeout=10).status_code == 401
    r = httpx.get(f"{server.url}/v1/secret", headers=server.headers, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_openai_client_with_wrong_key(server):
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
