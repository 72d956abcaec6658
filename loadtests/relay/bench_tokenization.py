"""Chat tokenization time against prompt length, up to 32k tokens: a full render of the
conversation at every turn, next to the incremental render (`engines/text/chat_cache.py`), in one run.

A conversation grows turn by turn (user and assistant messages of a few hundred tokens);
at each turn both paths tokenize the same conversation, and the incremental ids are checked
equal to the full ones. Each point is the median of `--repeats` timings.

    .venv/bin/python loadtests/relay/bench_tokenization.py [--max-tokens 32768] [--repeats 5]

Writes loadtests/reports/tokenization.json and loadtests/reports/tokenization.png.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engines.text.tokenizer import ChatTokenizer
from engines.weights import resolve_llm

WORDS = [
    "harbour", "tide", "cargo", "lantern", "ferry", "pier", "gull", "anchor", "rope", "mast", "sail",
    "compass", "chart", "reef", "beacon", "keel",
]


def _timed(fn, repeats: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def run(max_tokens: int, repeats: int) -> list[dict[str, float]]:
    model_dir = resolve_llm("smollm2-135m-instruct", ROOT / "model_repository")
    tok = ChatTokenizer(model_dir)
    rng = random.Random(0)
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    rows = []
    while True:
        messages.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(100, 400)))})

        def full() -> list[int]:
            text = tok._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return list(tok._tok.encode(text, add_special_tokens=False))

        full_s, ids = _timed(full, repeats)
        # The incremental path sees the conversation as a server does: the previous turn is cached.
        inc_s, inc_ids = _timed(lambda: tok.render_chat(messages), repeats)
        assert inc_ids == ids, "incremental tokenization differs from a full render"
        rows.append({"prompt_tokens": len(ids), "full_ms": full_s * 1000, "incremental_ms": inc_s * 1000})
        print(f"{len(ids):6d} tokens  full {full_s * 1000:7.2f} ms  incremental {inc_s * 1000:6.2f} ms")
        if len(ids) >= max_tokens:
            return rows
        messages.append({"role": "assistant",
                         "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(50, 300)))})


def plot(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r["prompt_tokens"] for r in rows]
    ax.plot(xs, [r["full_ms"] for r in rows], label="full render + tokenize")
    ax.plot(xs, [r["incremental_ms"] for r in rows], label="incremental (cached prefix)")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("time per turn (ms)")
    ax.set_title("Chat tokenization per turn, SmolLM2 tokenizer")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = run(args.max_tokens, args.repeats)
    out = ROOT / "loadtests" / "reports"
    report = {"benchmark": "chat tokenization per turn", "machine": {"python": platform.python_version()},
              "note": "incremental = template render + tokenizing only the text after the last cached special "
                      "token; ids checked equal to the full render at every turn", "rows": rows}
    (out / "tokenization.json").write_text(json.dumps(report, indent=1))
    plot(rows, out / "tokenization.png")


if __name__ == "__main__":
    main()
