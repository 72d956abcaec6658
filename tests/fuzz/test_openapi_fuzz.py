"""schemathesis against the gateway's own OpenAPI document, on a real `sluice serve`.

The server holds the default LLM (in-process transformers engine) and the classic
`digits_onnx` model. Every OpenAI route and every KServe v2 HTTP route the document lists is
fuzzed with schema-valid bodies (positive) and schema-breaking ones (negative), a bounded
number of cases each. Each response must:
- not be a 5xx, with two exceptions Triton makes too: the repository load/unload API answers 503
  in model control mode "none", and a well-formed request the engine does not support (e.g. a
  penalty the transformers engine lacks) is KServe's 501 UNSUPPORTED (OpenAI routes answer 400);
- carry a status, content type and body the document declares for the operation
  (`gateway/routes/openapi.py` declares them; errors are OpenAI's error object on OpenAI routes,
  Anthropic's `{"type": "error", "error": {...}}` on /v1/messages, and `{"error": str}` on /v2
  routes, which the document's error schemas and `error_in_protocol_shape` all check);
- for a negative case, be a 4xx refusal;
- for a stream, be well-formed SSE: JSON events ending in `[DONE]` (OpenAI chat and completions),
  numbered events from `response.created` to a terminal one (Responses), or named events from
  `message_start` to `message_stop` (Anthropic).
After all cases the server process is alive, /health answers 200 and a plain chat completes.

Constraints on generated cases, and why (`constrain` below):
- `model` (bodies) and `{name}` (KServe paths) are a served model three times in four in
  positive cases, else what schemathesis generated: random names would only ever reach the 404.
  One positive infer case in four carries one input digits_onnx accepts (`[1, 64]` FP32), keeping
  the generated outputs, parameters and id: random tensors would only ever reach a 400.
- `max_tokens`, `max_completion_tokens`, `max_new_tokens` and `min_tokens` are capped at 4 and
  set to 4 when absent, `n`/`best_of` at 2: the LLM runs on two shared CPU cores, and an uncapped
  request may generate thousands of tokens. Values schemathesis made invalid (negative, wrong type)
  are left alone, so the refusals are still exercised. A positive case's `best_of` is set to its `n`
  (anything else is refused as unsupported, a rule the document cannot express).
- `/v1/admin/*`, `/health`, `/version` and `/metrics` are not fuzzed: the first changes the
  worker set, the others take no input.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.properties import bounded
from tests.servers import DEFAULT_REPO, LLM_NAME, Server, llm_only_repository, start_server

pytestmark = pytest.mark.integration

CLASSIC = "digits_onnx"
TOKEN_CAP = 4
FANOUT_CAP = 2
_LLM_ROUTES = ("/v1/chat/completions", "/v1/completions", "/generate", "/generate_stream", "/v1/messages",
               "/v1/responses")

OPENAI_OPERATIONS = [
    "POST /v1/chat/completions", "POST /v1/completions", "POST /v1/embeddings", "GET /v1/models",
    "GET /v1/models/{model_id}", "POST /tokenize", "POST /detokenize",
]
ANTHROPIC_OPERATIONS = ["POST /v1/messages", "POST /v1/messages/count_tokens"]
RESPONSES_OPERATIONS = ["POST /v1/responses", "GET /v1/responses/{response_id}", "DELETE /v1/responses/{response_id}",
                        "GET /v1/responses/{response_id}/input_items"]
KSERVE_OPERATIONS = [
    "GET /v2", "GET /v2/health/live", "GET /v2/health/ready", "GET /v2/models/stats",
    "POST /v2/repository/index", "POST /v2/repository/models/{name}/load",
    "POST /v2/repository/models/{name}/unload",
    *(f"{method} /v2/models/{{name}}{version}{route}"
      for version in ("", "/versions/{version}")
      for method, route in (("GET", ""), ("GET", "/ready"), ("GET", "/config"), ("GET", "/stats"),
                            ("POST", "/infer"), ("POST", "/generate"), ("POST", "/generate_stream"))),
]
NOT_FUZZED = {"GET /health", "GET /version", "GET /metrics"}
REACH_SUCCESS = {"POST /v1/chat/completions", "POST /v1/completions", "POST /tokenize", "POST /detokenize",
                 "POST /v1/messages", "POST /v1/messages/count_tokens", "POST /v1/responses",
                 "POST /v2/models/{name}/generate", "POST /v2/models/{name}/generate_stream", "GET /v2/models/{name}",
                 "POST /v2/models/{name}/infer"}


def _examples(label: str, mode: GenerationMode) -> int:
    """Cases per operation and mode: about 430 in all, most where bodies are rich."""
    if label.endswith(_LLM_ROUTES):
        return 10 if mode is GenerationMode.POSITIVE else 8
    if label.endswith(("/infer", "/tokenize", "/detokenize", "/embeddings")):
        return 20 if mode is GenerationMode.POSITIVE else 15
    return 6


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("fuzz")
    repo = llm_only_repository(tmp)
    shutil.copytree(DEFAULT_REPO / CLASSIC, repo / CLASSIC)
    srv = start_server(["--model-repository", str(repo)], tmp / "server.log")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api(server: Server) -> schemathesis.BaseSchema:
    config = schemathesis.Config.from_dict({"seed": 0, "generation": {"deterministic": True,
                                                                     "database": "none"}})
    return schemathesis.openapi.from_url(server.url + "/openapi.json", config=config)


# ---- checks beyond the document's ---------------------------------------------------------------
def no_server_error(ctx: Any, response: schemathesis.Response, case: Case) -> None:
    if response.status_code < 500:
        return
    repository = "/v2/repository/models/" in case.path
    if repository and response.status_code == 503 and "model control mode 'none'" in response.text:
        return
    if response.status_code == 501 and case.path.startswith("/v2/") and "not supported" in response.text:
        return  # KServe's UNSUPPORTED is Triton's 501 (gateway/kserve/errors.py); OpenAI answers it 400
    raise AssertionError(f"{response.status_code} {response.text[:300]}")


def error_in_protocol_shape(ctx: Any, response: schemathesis.Response, case: Case) -> None:
    if response.status_code < 400 or case.path.endswith("/ready"):
        return  # a model that is not ready is a bare 400, as Triton answers
    body = json.loads(response.text)
    if case.path == "/v2" or case.path.startswith("/v2/"):
        assert isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str), body
    elif case.path.startswith("/v1/messages"):
        assert isinstance(body, dict) and body.get("type") == "error", body
        assert isinstance(body["error"].get("message"), str) and body["error"].get("type"), body
    else:
        error = body.get("error") if isinstance(body, dict) else None
        assert isinstance(error, dict) and isinstance(error.get("message"), str) and error.get("type"), body


def sse_well_formed(ctx: Any, response: schemathesis.Response, case: Case) -> None:
    if not response.headers.get("content-type", [""])[0].startswith("text/event-stream"):
        return
    # SSE lines end only at CR, LF or CRLF; str.splitlines would also split a generated text's raw
    # U+2028 or NEL, which JSON does not escape.
    lines = re.split(r"\r\n|\r|\n", response.text)
    data = [line[5:].strip() for line in lines if line.startswith("data:")]
    assert data, "an event stream without events"
    if case.path.startswith("/v1/messages"):  # Anthropic's: named events, message_start ... message_stop
        names = [line[6:].strip() for line in lines if line.startswith("event:")]
        events = [json.loads(item) for item in data]
        assert names == [e.get("type") for e in events], names
        assert names[0] == "message_start" and names[-1] in ("message_stop", "error"), names
        return
    if case.path.startswith("/v1/responses"):  # the Responses API's: named, numbered, no [DONE]
        events = [json.loads(item) for item in data]
        assert [e["sequence_number"] for e in events] == list(range(len(events))), events[:3]
        assert events[0]["type"] == "response.created", events[0]
        assert events[-1]["type"] in ("response.completed", "response.incomplete", "response.failed"), events[-1]
        return
    openai = not case.path.startswith("/v2")
    if openai:
        assert data[-1] == "[DONE]", data[-3:]
        data = data[:-1]
    for item in data:
        event = json.loads(item)
        assert isinstance(event, dict), item
        if "error" in event:
            continue
        if openai:
            assert event.get("object") in ("chat.completion.chunk", "text_completion"), event
        else:
            assert isinstance(event.get("text_output"), str), event


CHECKS = [no_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection, error_in_protocol_shape, sse_well_formed]


# ---- bounding what a case may ask of the LLM ----------------------------------------------------
def _cap(params: dict[str, Any], keys: tuple[str, ...], cap: int, *, fill: bool) -> None:
    if fill and params.get(keys[0]) is None:
        params[keys[0]] = cap
    for key in keys:
        value = params.get(key)  # a float counts: 4000.0 is an integer to pydantic (and to OpenAI)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > cap:
            params[key] = cap


def constrain(case: Case, pick: int) -> None:
    """Steer a positive case to a served model three times in four, and bound its cost."""
    positive = case.meta is None or case.meta.generation.mode.is_positive
    served = pick % 4 != 3 and positive
    path = case.path_parameters or {}
    if served and "name" in path:
        path["name"] = LLM_NAME if case.path.endswith(("/generate", "/generate_stream")) or pick == 2 else CLASSIC
        if "version" in path:
            path["version"] = "1"
    body = case.body
    if not isinstance(body, dict):
        return
    if served and "model" in body:
        body["model"] = LLM_NAME
    if served and pick == 0 and case.path.endswith("/infer") and isinstance(body.get("inputs"), list):
        # One input digits_onnx accepts; the generated outputs, parameters and id stay.
        body["inputs"] = [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]
        if path.get("name") != CLASSIC:
            path["name"] = CLASSIC
    if any(case.path.endswith(r) for r in _LLM_ROUTES):
        tokens = ("max_tokens", "max_completion_tokens", "max_new_tokens", "min_tokens")
        if case.path.endswith("/v1/responses"):
            tokens = ("max_output_tokens", "min_tokens")
        # A negative case the server still takes must not generate to the model's limit either.
        _cap(body, tokens, TOKEN_CAP, fill=positive or case.path.endswith("/v1/responses"))
        _cap(body, ("n", "best_of"), FANOUT_CAP, fill=False)
        if positive and "best_of" in body:
            body["best_of"] = body.get("n", 1)  # best_of other than n is refused as unsupported
        params = body.get("parameters")
        if isinstance(params, dict):
            _cap(params, tokens, TOKEN_CAP, fill=False)


# ---- the fuzz run -------------------------------------------------------------------------------
def fuzz(api: schemathesis.BaseSchema, server: Server, label: str, mode: GenerationMode
         ) -> tuple[list[str], Counter[int]]:
    """Run `label`'s cases in `mode`: one line per distinct failure, and the statuses answered."""
    operation = api.find_operation_by_label(label)
    assert operation is not None, f"{label} is not in the served document"
    failures: dict[str, str] = {}
    statuses: Counter[int] = Counter()

    # No shrinking: every distinct failure is collected instead. A path of plain strings has no
    # schema-breaking value, so negative generation may filter everything out (Unsatisfiable).
    @settings(bounded(_examples(label, mode)), phases=[Phase.explicit, Phase.generate],
              suppress_health_check=[*bounded(1).suppress_health_check, HealthCheck.filter_too_much])
    @given(case=operation.as_strategy(generation_mode=mode), pick=st.integers(0, 3))
    def run(case: Case, pick: int) -> None:
        constrain(case, pick)
        response = case.call(base_url=server.url, timeout=60)
        statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except (Failure, FailureGroup) as exc:
            group = exc.exceptions if isinstance(exc, FailureGroup) else [exc]
            for failure in group:
                key = f"{failure.title}: {failure.message}"[:400]
                failures.setdefault(key.split("\n")[0], f"{key}\n    {case.as_curl_command()[:600]}")

    try:
        run()
    except Unsatisfiable:
        assert mode is GenerationMode.NEGATIVE  # nothing to break in an operation without inputs
    return list(failures.values()), statuses


def test_every_input_taking_route_is_fuzzed(api: schemathesis.BaseSchema) -> None:
    served = {result.ok().label for result in api.get_all_operations()}
    fuzzed = set(OPENAI_OPERATIONS) | set(ANTHROPIC_OPERATIONS) | set(RESPONSES_OPERATIONS) | set(KSERVE_OPERATIONS)
    assert fuzzed <= served
    assert {label for label in served - fuzzed if not label.split()[1].startswith("/v1/admin")} == NOT_FUZZED


@pytest.mark.parametrize("label", OPENAI_OPERATIONS + ANTHROPIC_OPERATIONS + RESPONSES_OPERATIONS + KSERVE_OPERATIONS)
def test_route_survives_its_fuzz_cases(api: schemathesis.BaseSchema, server: Server, label: str) -> None:
    failures, statuses = [], Counter[int]()
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        lines, answered = fuzz(api, server, label, mode)
        failures += [f"[{mode.value}] {line}" for line in lines]
        statuses += answered
    assert not failures, "\n".join([f"statuses answered: {dict(statuses)}", *failures])
    assert server.proc.poll() is None, server.log()[-3000:]
    if label in REACH_SUCCESS:  # the constraints work: some cases got past validation to a model
        assert any(200 <= s < 300 for s in statuses), statuses


def test_server_alive_and_healthy_after_the_fuzz(server: Server) -> None:
    assert server.proc.poll() is None, server.log()[-3000:]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": LLM_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi"}]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
    # Found by the fuzz: "ready" was read by truthiness, so "false" listed only the ready models.
    assert httpx.post(server.url + "/v2/repository/index", json={"ready": "false"}).status_code == 400
    assert "Traceback" not in Path(server.log_path).read_text(errors="replace"), server.log()[-3000:]
