"""The served OpenAPI document says what the routes answer (what tests/fuzz holds the server to)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.http.app import create_app
from gateway.llm.params import MAX_CHOICES
from gateway.settings import Settings


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    repo: Path = tmp_path_factory.mktemp("repo")
    return create_app(Settings(model_repository=repo)).openapi()


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, item in document["paths"].items() for method, op in item.items()]


def test_no_route_documents_fastapis_422_and_errors_are_in_the_routes_protocol(document: dict[str, Any]) -> None:
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for path, method, op in _operations(document):
        assert "422" not in op["responses"], (method, path)
        kserve = path.startswith("/v2")
        for status, response in op["responses"].items():
            if int(status) < 400 or path in ("/health", "/version", "/metrics") or path.endswith("/ready"):
                continue
            ref = response["content"]["application/json"]["schema"]["$ref"]
            expected = "/KServeError" if kserve else "/AnthropicError" if path.startswith("/v1/messages") else \
                "/OpenAIError"
            assert ref.endswith(expected), (method, path, status)
        assert "400" in op["responses"] or path in ("/health", "/version", "/metrics"), (method, path)


def test_kserve_bodies_and_the_binary_extension_are_documented(document: dict[str, Any]) -> None:
    infer = document["paths"]["/v2/models/{name}/infer"]["post"]
    assert set(infer["requestBody"]["content"]) == {"application/json", "application/octet-stream"}
    assert "Inference-Header-Content-Length" in {p["name"] for p in infer["parameters"]}
    generate = document["paths"]["/v2/models/{name}/versions/{version}/generate"]["post"]
    assert generate["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/GenerateRequest")
    assert "text/event-stream" in document["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]


def test_sampling_bounds_are_the_ones_the_gateway_enforces(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    n = schemas["CompletionRequest"]["properties"]["n"]
    assert (n["minimum"], n["maximum"]) == (1, MAX_CHOICES)
    temperature = schemas["GenerateParams"]["properties"]["temperature"]["anyOf"][0]
    assert (temperature["minimum"], temperature["maximum"]) == (0, 2)
    top_p = schemas["ChatCompletionRequest"]["properties"]["top_p"]["anyOf"][0]
    assert top_p["exclusiveMinimum"] == 0 and top_p["maximum"] == 1
