"""The served OpenAPI document (`/openapi.json`), completed to say what the routes really do.

FastAPI derives request schemas from the OpenAI routes' pydantic models and nothing else: it
documents a 422 that no route answers (validation errors are 400s in the route's protocol), a
bare `{}` for every response, and no body at all for the KServe routes, which read their bodies
themselves; nor does it know KServe infer, a pure-ASGI route outside its router
(`gateway/kserve/infer_http.py`). This module adds the infer operations, the error responses of
each protocol, the response bodies, and the KServe v2 request bodies, so that clients and
schema-driven fuzzers (`tests/fuzz`) see the real contract. Only the document changes; no
route's behaviour does.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from gateway.kserve.params import GenerateParams
from gateway.llm import params as limits

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(required: list[str], **props: Schema) -> Schema:
    return {"type": "object", "required": required, "properties": props}


_STR: Schema = {"type": "string"}
_INT: Schema = {"type": "integer"}
_NULLABLE_STR: Schema = {"type": ["string", "null"]}
_ANY_OBJ: Schema = {"type": "object"}

_OPENAI_ERROR = _obj(["error"], error=_obj(["message", "type"], message=_STR, type=_STR, param=_NULLABLE_STR,
                                           code={"type": ["string", "integer", "null"]}))
_KSERVE_ERROR = _obj(["error"], error=_STR)
_ANTHROPIC_ERROR = _obj(["type", "error"], type={"const": "error"}, error=_obj(["type", "message"], type=_STR,
                                                                               message=_STR))

_USAGE = _obj(["prompt_tokens", "completion_tokens", "total_tokens"], prompt_tokens=_INT,
              completion_tokens=_INT, total_tokens=_INT)
_FINISH: Schema = {"type": ["string", "null"]}
_CHAT = _obj(["id", "object", "created", "model", "choices"], id=_STR, object={"const": "chat.completion"},
             created=_INT, model=_STR, usage=_USAGE, choices={"type": "array", "items": _obj(
                 ["index", "message", "finish_reason"], index=_INT, finish_reason=_FINISH,
                 message=_obj(["role"], role={"const": "assistant"}, content=_NULLABLE_STR))})
_COMPLETION = _obj(["id", "object", "created", "model", "choices"], id=_STR, object={"const": "text_completion"},
                   created=_INT, model=_STR, usage=_USAGE, choices={"type": "array", "items": _obj(
                       ["index", "text", "finish_reason"], index=_INT, text=_STR, finish_reason=_FINISH)})
_MESSAGE = _obj(["id", "type", "role", "model", "content", "stop_reason", "usage"], id=_STR,
                type={"const": "message"}, role={"const": "assistant"}, model=_STR, stop_reason=_NULLABLE_STR,
                stop_sequence=_NULLABLE_STR, content={"type": "array", "items": _obj(["type"], type=_STR)},
                usage=_obj(["input_tokens", "output_tokens"], input_tokens=_INT, output_tokens=_INT))
_RESPONSE = _obj(["id", "object", "created_at", "status", "model", "output"], id=_STR, object={"const": "response"},
                 created_at=_INT, status=_STR, model=_STR, output={"type": "array", "items": _obj(["type"], type=_STR)})
# One server-sent event as schemathesis reads it; `tests/fuzz` checks each event's JSON payload.
_SSE_EVENT = _obj(["data"], data=_STR)
_MODEL_CARD = _obj(["id", "object", "created", "owned_by"], id=_STR, object={"const": "model"}, created=_INT,
                   owned_by=_STR)
_EMBEDDINGS = _obj(["object", "data", "model", "usage"], object={"const": "list"}, model=_STR, usage=_ANY_OBJ,
                   data={"type": "array", "items": _obj(["object", "index", "embedding"], object=_STR,
                                                        index=_INT, embedding={"type": ["array", "string"]})})

_TENSOR_SHAPE: Schema = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_INFER_INPUT = _obj(["name", "shape", "datatype"], name=_STR, shape=_TENSOR_SHAPE, datatype=_STR,
                    data={"type": "array"}, parameters=_ANY_OBJ)
_INFER_REQUEST = _obj(["inputs"], id=_STR, parameters=_ANY_OBJ, inputs={"type": "array", "items": _INFER_INPUT},
                      outputs={"type": "array", "items": _obj(["name"], name=_STR, parameters=_ANY_OBJ)})
_INFER_RESPONSE = _obj(["model_name", "outputs"], model_name=_STR, model_version=_STR, id=_STR, outputs={
    "type": "array", "items": _obj(["name", "datatype", "shape"], name=_STR, datatype=_STR,
                                   shape={"type": "array", "items": _INT})})
_GENERATE_REQUEST = _obj(["text_input"], text_input=_STR, id=_STR, parameters=_ref("GenerateParams"))
_GENERATE_RESPONSE = _obj(["model_name", "text_output"], model_name=_STR, model_version=_STR, text_output=_STR)
_INDEX_ROW = _obj(["name", "state"], name=_STR, version=_STR, state=_STR, reason=_STR)

COMPONENTS: dict[str, Schema] = {
    "OpenAIError": _OPENAI_ERROR, "KServeError": _KSERVE_ERROR, "ChatCompletion": _CHAT,
    "Completion": _COMPLETION, "ServerSentEvent": _SSE_EVENT, "ModelCard": _MODEL_CARD, "EmbeddingList": _EMBEDDINGS,
    "InferRequest": _INFER_REQUEST, "InferResponse": _INFER_RESPONSE, "GenerateRequest": _GENERATE_REQUEST,
    "GenerateResponse": _GENERATE_RESPONSE, "AnthropicError": _ANTHROPIC_ERROR, "MessageResponse": _MESSAGE,
    "ResponseObject": _RESPONSE,
}

# Every status a route of each protocol may answer besides its success (see the error tables
# in gateway/openai/errors.py and gateway/kserve/errors.py, and the 413 of the body limit).
_OPENAI_STATUSES: tuple[str, ...] = ("400", "404", "405", "413", "500", "503")
_KSERVE_STATUSES: tuple[str, ...] = ("400", "404", "405", "413", "500", "501", "503")
_ADMIN_STATUSES: tuple[str, ...] = ("401", "403", "409")
_ANTHROPIC_STATUSES: tuple[str, ...] = ("400", "404", "405", "413", "500", "529")  # gateway/anthropic/errors.py

_JSON = "application/json"
_SSE = "text/event-stream"


def _content(schema: Schema, media_type: str = _JSON) -> dict[str, Any]:
    return {media_type: {"schema": schema}}


def _json_or_stream(schema: str) -> dict[str, Any]:
    return {**_content(_ref(schema)), **_content(_ref("ServerSentEvent"), _SSE)}


# (method, path) -> the success response's status and content (None: no body).
_SUCCESS: dict[tuple[str, str], tuple[str, dict[str, Any] | None]] = {
    ("post", "/v1/chat/completions"): ("200", _json_or_stream("ChatCompletion")),
    ("post", "/v1/completions"): ("200", _json_or_stream("Completion")),
    ("post", "/v1/embeddings"): ("200", _content(_ref("EmbeddingList"))),
    ("post", "/v1/messages"): ("200", _json_or_stream("MessageResponse")),
    ("post", "/v1/responses"): ("200", _json_or_stream("ResponseObject")),
    ("get", "/v1/responses/{response_id}"): ("200", _content(_ref("ResponseObject"))),
    ("delete", "/v1/responses/{response_id}"): ("200", _content(_obj(["id", "object", "deleted"], id=_STR,
                                                                      object=_STR, deleted={"type": "boolean"}))),
    ("get", "/v1/responses/{response_id}/input_items"): ("200", _content(_obj(
        ["object", "data", "has_more"], object={"const": "list"}, has_more={"type": "boolean"},
        data={"type": "array", "items": _obj(["type"], type=_STR)}))),
    ("post", "/v1/messages/count_tokens"): ("200", _content(_obj(["input_tokens"], input_tokens=_INT))),
    ("get", "/v1/models"): ("200", _content(_obj(["object", "data"], object={"const": "list"},
                                                 data={"type": "array", "items": _ref("ModelCard")}))),
    ("get", "/v1/models/{model_id}"): ("200", _content(_ref("ModelCard"))),
    ("post", "/tokenize"): ("200", _content(_obj(["tokens", "count"], count=_INT, max_model_len=_INT,
                                                 tokens={"type": "array", "items": _INT}))),
    ("post", "/detokenize"): ("200", _content(_obj(["prompt"], prompt=_STR))),
    ("get", "/v2"): ("200", _content(_obj(["name", "version", "extensions"], name=_STR, version=_STR,
                                          extensions={"type": "array", "items": _STR}))),
    ("get", "/v2/health/live"): ("200", None),
    ("get", "/v2/health/ready"): ("200", None),
    ("post", "/v2/repository/index"): ("200", _content({"type": "array", "items": _INDEX_ROW})),
    ("post", "/v2/repository/models/{name}/load"): ("200", None),
    ("post", "/v2/repository/models/{name}/unload"): ("200", None),
    ("post", "/v1/admin/workers"): ("201", _content(_obj(["name", "models"], name=_STR,
                                                         models={"type": "array", "items": _STR}))),
    ("delete", "/v1/admin/workers/{name}"): ("204", None),
    ("get", "/health"): ("200", _content(_obj(["status"], status={"const": "ok"}))),
    ("get", "/version"): ("200", _content(_obj(["version"], version=_STR))),
    ("get", "/metrics"): ("200", {"text/plain": {"schema": _STR}}),
}
# /health while starting or degraded; the operations routes answer no other error.
_OPS = {"/health": {"503": {"description": "Not ready", "content": _content(_obj(
    ["status", "detail"], status={"const": "unavailable"}, detail=_STR))}}, "/version": {}, "/metrics": {}}
# Routes under /v2/models/{name} and /v2/models/{name}/versions/{version}, by suffix.
_MODEL_SUCCESS: dict[tuple[str, str], tuple[str, dict[str, Any] | None]] = {
    ("get", ""): ("200", _content(_obj(["name", "platform", "inputs", "outputs"], name=_STR, platform=_STR,
                                       versions={"type": "array", "items": _STR}, inputs={"type": "array"},
                                       outputs={"type": "array"}))),
    ("get", "/ready"): ("200", None),
    ("get", "/config"): ("200", _content(_ANY_OBJ)),
    ("get", "/stats"): ("200", _content(_obj(["model_stats"], model_stats={"type": "array"}))),
    ("post", "/infer"): ("200", {**_content(_ref("InferResponse")), "application/octet-stream": {}}),
    ("post", "/generate"): ("200", _content(_ref("GenerateResponse"))),
    ("post", "/generate_stream"): ("200", _content(_ref("ServerSentEvent"), _SSE)),
}
_MODEL_BODIES = {"/infer": "InferRequest", "/generate": "GenerateRequest", "/generate_stream": "GenerateRequest"}
_REPOSITORY_BODIES = {
    "/v2/repository/index": _obj([], ready={"type": "boolean"}),
    "/v2/repository/models/{name}/load": _obj([], parameters=_ANY_OBJ),
    "/v2/repository/models/{name}/unload": _obj([], parameters=_ANY_OBJ),
}
_INFER_HEADER = {"name": "Inference-Header-Content-Length", "in": "header", "required": False,
                 "schema": {"type": "integer", "minimum": 0}}


_TEXT = {"minLength": 1, "maxLength": limits.MAX_STOP_STRING_CHARS}
# The model-independent bounds `gateway.llm.params.check` enforces (top_k's upper bound and
# token ids' depend on the model's vocabulary), as keywords for the branches of a field's
# schema whose type matches: the pydantic models declare types only.
_BOUNDS: dict[str, dict[str, Schema]] = {
    "temperature": {"number": {"minimum": 0, "maximum": 2}},
    "top_p": {"number": {"exclusiveMinimum": 0, "maximum": 1}},
    "min_p": {"number": {"minimum": 0, "maximum": 1}},
    "repetition_penalty": {"number": {"exclusiveMinimum": 0, "maximum": 10}},
    "presence_penalty": {"number": {"minimum": -2, "maximum": 2}},
    "frequency_penalty": {"number": {"minimum": -2, "maximum": 2}},
    "seed": {"integer": {"minimum": limits.SEED_RANGE[0], "maximum": limits.SEED_RANGE[1]}},
    "n": {"integer": {"minimum": 1, "maximum": limits.MAX_CHOICES}},
    "logprobs": {"integer": {"minimum": 0, "maximum": limits.MAX_TOP_LOGPROBS}},
    "top_logprobs": {"integer": {"minimum": 0, "maximum": limits.MAX_TOP_LOGPROBS}},
    "top_k": {"integer": {"minimum": -1}},
    **{name: {"integer": {"minimum": 0}} for name in ("max_tokens", "max_completion_tokens", "max_new_tokens",
                                                       "min_tokens")},
    "stop": {"string": _TEXT, "array": {"maxItems": limits.MAX_STOP_STRINGS, "items": {"type": "string", **_TEXT}}},
    "stop_token_ids": {"array": {"maxItems": limits.MAX_STOP_TOKEN_IDS, "items": {"type": "integer", "minimum": 0}}},
    "suffix": {"string": {"maxLength": 0}},  # not supported: only the empty suffix is accepted
    "logit_bias": {"object": {"maxProperties": limits.MAX_LOGIT_BIAS,
                              "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}}},
}
_SAMPLING_SCHEMAS = ("ChatCompletionRequest", "CompletionRequest", "GenerateParams")


def _bound(properties: dict[str, Schema]) -> None:
    for name, by_type in _BOUNDS.items():
        field = properties.get(name)
        if field is None:
            continue
        for branch in field.get("anyOf", [field]):
            branch.update(by_type.get(branch.get("type", ""), {}))


def _model_prefix(path: str) -> str | None:
    for prefix in ("/v2/models/{name}/versions/{version}", "/v2/models/{name}"):
        if path.startswith(prefix):
            return prefix
    return None


def _model_suffix(path: str) -> str | None:
    prefix = _model_prefix(path)
    return None if prefix is None else path[len(prefix):]


def _with_infer(paths: dict[str, Any]) -> dict[str, Any]:
    """`paths` plus the infer operations, each after its model's /stats (where the others of the model are)."""
    out: dict[str, Any] = {}
    for path, item in paths.items():
        out[path] = item
        prefix = _model_prefix(path)
        if prefix is not None and path == prefix + "/stats":
            infer = prefix + "/infer"
            parameters = [{"name": p, "in": "path", "required": True, "schema": {"type": "string", "title": p.title()}}
                          for p in re.findall(r"{(\w+)}", infer)]
            # The summary and operation id FastAPI would give a route named `infer`.
            out[infer] = {"post": {"summary": "Infer", "operationId": "infer" + re.sub(r"\W", "_", infer) + "_post",
                                   "parameters": parameters}}
    return out


def document(schema: dict[str, Any]) -> dict[str, Any]:
    """Complete FastAPI's document in place (and return it)."""
    if "paths" in schema:
        schema["paths"] = _with_infer(schema["paths"])
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(COMPONENTS)
    components["GenerateParams"] = GenerateParams.model_json_schema(ref_template="#/components/schemas/{model}")
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    for name in _SAMPLING_SCHEMAS:
        _bound(components[name].get("properties", {}))
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            _document_operation(path, method, op)
    return schema


def _document_operation(path: str, method: str, op: dict[str, Any]) -> None:
    kserve = path == "/v2" or path.startswith("/v2/")
    suffix = _model_suffix(path) if kserve else None
    success = _MODEL_SUCCESS.get((method, suffix)) if suffix is not None else _SUCCESS.get((method, path))
    responses = op.setdefault("responses", {})
    responses.pop("422", None)
    if success is not None:
        status, content = success
        responses.pop("200", None)
        responses[status] = {"description": "Success"} | ({"content": content} if content else {})
    if path in _OPS:
        responses.update(_OPS[path])
        return
    anthropic = path.startswith("/v1/messages")
    statuses = _KSERVE_STATUSES if kserve else _ANTHROPIC_STATUSES if anthropic else _OPENAI_STATUSES
    if path.startswith("/v1/admin"):
        statuses += _ADMIN_STATUSES
    error = _ref("KServeError" if kserve else "AnthropicError" if anthropic else "OpenAIError")
    for status in statuses:
        responses.setdefault(status, {"description": "Error", "content": _content(error)})
    if suffix == "/ready":
        responses["400"] = {"description": "The model is not ready"}  # Triton answers a bare 400
    body = _MODEL_BODIES.get(suffix or "") if kserve else None
    if method == "post" and body is not None:
        op["requestBody"] = {"required": True, "content": _content(_ref(body))}
        if suffix == "/infer":
            op["requestBody"]["content"]["application/octet-stream"] = {"schema": {"type": "string",
                                                                                   "format": "binary"}}
            op.setdefault("parameters", []).append(_INFER_HEADER)
    elif method == "post" and path in _REPOSITORY_BODIES:
        op["requestBody"] = {"required": False, "content": _content(_REPOSITORY_BODIES[path])}


def install(app: FastAPI) -> None:
    """Serve the completed document at /openapi.json (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(get_openapi(title=app.title, version=app.version, routes=app.routes))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
