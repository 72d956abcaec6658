"""Process logging: text for people, or one JSON object per line for log pipelines (`--log-format json`).

Records never carry a prompt, a completion or a key: the access log's fields are the
request id, method, route, status, model, worker, sizes and timings, passed as `extra`.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

LOG_FORMATS = ("text", "json")
# LogRecord's own attributes: anything else on a record came from `extra`.
_STANDARD = frozenset(vars(logging.LogRecord("x", 0, "", 0, "", None, None))) | {"message", "asctime"}


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
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


def uvicorn_log_config(fmt: str) -> dict[str, Any] | None:
    """uvicorn's own loggers through the same handler (None keeps uvicorn's default text)."""
    if fmt != "json":
        return None
    return {"version": 1, "disable_existing_loggers": False,
            "formatters": {"json": {"()": JsonFormatter}},
            "handlers": {"default": {"class": "logging.StreamHandler", "formatter": "json"}},
            "loggers": {"uvicorn": {"handlers": ["default"], "propagate": False},
                        "uvicorn.error": {"handlers": ["default"], "propagate": False}}}
