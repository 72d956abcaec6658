"""Summarise a py-spy raw (collapsed-stack) profile: the functions that take the most time.

Each line of py-spy's `--format raw` output is ``frame;frame;...;frame COUNT``, outermost first,
a frame being ``function (file:line)``. `summarize` returns the top functions by *self* samples
(the frame on top of the stack) and by *inclusive* samples (anywhere on the stack, once per
sample), each as a share of all samples, with file paths shortened to the package.

    .venv/bin/python loadtests/lib/pyspy_summary.py profile.txt [--top 30]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_SHORTEN = re.compile(r"^.*?/(site-packages|lib/python3\.\d+|wt-[\w-]+|main)/")


def _frame_name(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = _SHORTEN.sub("", m.group("file"))
    return f"{m.group('fn')} ({path})"


def parse(text: str) -> list[tuple[list[str], int]]:
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_frame_name(f) for f in stack.split(";") if f]
        stacks.append((frames, int(count)))
    return stacks


def summarize(text: str, top: int = 30) -> dict[str, Any]:
    stacks = parse(text)
    total = sum(c for _, c in stacks) or 1
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for frames, count in stacks:
        # A sample's top frame may be a thread or process header in py-spy's output: skip those.
        real = [f for f in frames if "(" in f]
        if real:
            own[real[-1]] += count
        for f in set(real):
            incl[f] += count
    return {"samples": total,
            "self": [{"function": f, "share": round(c / total, 4)} for f, c in own.most_common(top)],
            "inclusive": [{"function": f, "share": round(c / total, 4)} for f, c in incl.most_common(top)]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile", type=Path)
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    print(json.dumps(summarize(args.profile.read_text(), args.top), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
