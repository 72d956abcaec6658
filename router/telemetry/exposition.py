"""A few named samples from a Prometheus text exposition, without parsing the rest.

The router scrapes every worker's `/metrics` every `scrape_interval_s` for four gauges, and a
vLLM exposition is hundreds of lines, most of them histogram buckets. prometheus_client's parser
builds and validates every family (4.4 ms for a sim worker's 95 lines on these CPUs, so 64
workers scraped every 2 s cost 14 % of a core); this reads only the lines it is asked for.

The first sample line is checked to be one (a name, optional labels, a number), so a page that is
not an exposition at all (an HTML error page) is an error rather than an empty scrape, as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_SAMPLE = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*(?:\{.*\})?[ \t]+(\S+)(?:[ \t]+\S+)?[ \t]*")
_NAME_END = re.compile(r"[ \t{]")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def samples(text: str, names: tuple[str, ...]) -> Iterator[tuple[str, str, float]]:
    """(name, label text, value) of every sample of `names`, in order. Raises ValueError on a
    malformed line among them, or when the first sample line is not a sample."""
    checked = False
    for line in text.split("\n"):  # not splitlines(): label values may hold \x85, \u2028, \x0c ...
        line = line.rstrip("\r")
        if not line or line[0] == "#":
            continue
        if not checked:
            m = _SAMPLE.fullmatch(line)
            if m is None:
                raise ValueError(f"not a Prometheus exposition: {line[:80]!r}")
            _number(m.group(1), line)
            checked = True
        if not line.startswith(names):
            continue
        m = _NAME_END.search(line)
        if m is not None and m.group(0) == "{":
            end = line.rfind("}")
            if end < m.start():
                raise ValueError(f"unclosed labels: {line[:80]!r}")
            name, labels, rest = line[:m.start()], line[m.start() + 1:end], line[end + 1:]
        else:
            cut = len(line) if m is None else m.start()
            name, labels, rest = line[:cut], "", line[cut:]
        if name not in names:  # a longer name that starts with one of them
            continue
        fields = rest.split()
        if not fields:
            raise ValueError(f"sample without a value: {line[:80]!r}")
        yield name, labels, _number(fields[0], line)


def labels(text: str) -> dict[str, str]:
    """The label text of a sample (`a="1",b="x"`) as a dict, escapes undone."""
    return {k: re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], v) for k, v in _LABEL.findall(text)}


def _number(value: str, line: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"not a number in {line[:80]!r}") from None
