"""Process logging: text for people, or one JSON object per line for log pipelines (`--log-format json`).

Records never carry a prompt, a completion or a key: the access log's fields are the
request id, method, route, status, model, worker, sizes and timings, passed as `extra`.
Every record logged while a request is handled, by any logger, carries that request's
`request_id` and, once it has a trace, `trace_id` (`RequestFilter`, from
`gateway.telemetry.context`): JSON fields, or ` request_id=… trace_id=…` after a text line.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from gateway.telemetry import context

LOG_FORMATS = ("text", "json")
# LogRecord's own attributes: anything else on a record came from `extra`.
_STANDARD = frozenset(vars(logging.LogRecord("x", 0, "", 0, "", None, None))) | {"message", "asctime"}


class RequestFilter(logging.Filter):
    """Adds the current request's `request_id` and `trace_id` to each record (a handler's filter, so
    records of every logger get them); a record's own values, passed as `extra`, are kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = context.current()
        if ctx is not None:
            if not hasattr(record, "request_id"):
                record.request_id = ctx.request_id
            if ctx.trace_id is not None and not hasattr(record, "trace_id"):
                record.trace_id = ctx.trace_id
        return True


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = " ".join(f"{k}={v}" for k in ("request_id", "trace_id") if (v := getattr(record, k, None)))
        if not ids:
            return line
        head, newline, rest = line.partition("\n")  # after the message, before a traceback
        return f"{head} {ids}{newline}{rest}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RequestFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


def uvicorn_log_config(fmt: str) -> dict[str, Any] | None:
    """uvicorn's own loggers through the same handler (None keeps uvicorn's default text)."""
    if fmt != "json":
        return None
    return {"version": 1, "disable_existing_loggers": False,
            "formatters": {"json": {"()": JsonFormatter}}, "filters": {"request": {"()": RequestFilter}},
            "handlers": {"default": {"class": "logging.StreamHandler", "formatter": "json",
                                     "filters": ["request"]}},
            "loggers": {"uvicorn": {"handlers": ["default"], "propagate": False},
                        "uvicorn.error": {"handlers": ["default"], "propagate": False}}}
