"""The OpenAPI document tells the truth: every status the server returns is documented (no 422, which it never
returns), requests carry their value ranges and shapes, and a bounded schemathesis run over every route against
a live server finds no server error, no undocumented status or content type, no response that breaks its
schema, and no schema-invalid request accepted."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.server.conftest import started_together

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
    "response_headers_conformance,negative_data_rejection"
)


@pytest.fixture(scope="module")
def open_server(tiny_model_dir):
    """No API key (the fuzzer should reach the handlers), generation bounded to 16 tokens."""
    with started_together(tiny_model_dir, ("--max-tokens-limit", "16", "--max-n", "4")) as (server,):
        yield server


def test_document_lists_what_the_server_returns(open_server):
    doc = httpx.get(f"{open_server.url}/openapi.json", timeout=10).json()
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            assert "422" not in operation["responses"], (method, path)
            if method == "post":
                assert {"400", "408", "413", "503"} <= set(operation["responses"]), (method, path)
    assert "404" in doc["paths"]["/v1/models/{model_id}"]["get"]["responses"]
    assert set(doc["paths"]["/v1/responses/{response_id}"]["get"]["responses"]) == {"401", "404", "503"}
    responses = doc["paths"]["/v1/responses"]["post"]["responses"]
    assert "text/event-stream" in responses["200"]["content"] and "504" in responses
    completions = doc["paths"]["/v1/completions"]["post"]["responses"]
    assert "text/event-stream" in completions["200"]["content"] and "504" in completions
    request = doc["components"]["schemas"]["CompletionRequest"]["properties"]
    assert request["n"]["maximum"] == 4 and request["max_tokens"]["anyOf"][0]["maximum"] == 16
    assert all(branch.get("type") != "null" for branch in request["prompt"]["anyOf"])  # {"prompt": null}: 400
    assert len(doc["components"]["schemas"]["TokenizeRequest"]["oneOf"]) == 2  # {}: 400


def test_schemathesis_finds_nothing(open_server, tmp_path):
    """About a minute and a half on 2 CPU cores: every route, coverage and fuzzing phases, fixed seed."""
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{open_server.url}/openapi.json",
        "--checks", CHECKS,
        "--max-examples", "25",
        "--max-time", "100",
        "--phases", "coverage,fuzzing,stateful",
        "--suppress-health-check", "filter_too_much,too_slow",
        "--generation-database", "none",
        "--seed", "0",
        "--request-timeout", "30",
    ]  # fmt: skip
    # In a folder of its own: schemathesis leaves a .schemathesis/ folder where it runs.
    result = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert open_server.proc.poll() is None
    assert "Traceback" not in open_server.logs()
