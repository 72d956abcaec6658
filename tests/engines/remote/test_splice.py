"""engines.remote.splice: a worker's plain events read through a template mean what decoding them means.

Each stream here is fed, in the same reads, to the full path (`orjson.loads`, `StreamAssembler`,
`coalesce`) and to `SplicedBatch`; the Deltas must agree (text, counts, finish, usage) and a
spliced text must be exactly the bytes orjson writes for the decoded one.
"""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest

from engines.base import Delta
from engines.remote.splice import PlainTemplate, SplicedBatch, canonical_body, json_body
from engines.remote.stream import StreamAssembler, coalesce
from engines.sim.serving.openai_responses import ResponseShaper

TEXTS = [" the", " gate", "é", "\n", 'say "hi"', "", "\u2028", " end", "back\\", "/", "\t", "日本", "😀", " x"]


def _events(kind: str, *, ids: bool, n: int = 60, seed: int = 0) -> list[dict[str, Any]]:
    """A stream shaped as vLLM sends it (the sim's shapes): role chunk (chat), text chunks, finish, usage;
    then one more text chunk, as a misbehaving worker might send."""
    rng = random.Random(seed)
    shaper = ResponseShaper(kind, "cmpl-w1", "m", 7, return_token_ids=ids, prompt_token_ids=[1, 2, 3])
    out = [shaper.role_chunk()] if kind == "chat" else []
    for i in range(n):
        token_ids = [100 + i] if i % 9 else [100 + i, 5, 0]  # now and then several tokens in one event
        out.append(shaper.chunk(rng.choice(TEXTS), token_ids, None, i == 0))
    out.append(shaper.chunk("!", [7], "length", False))
    out.append(shaper.usage_chunk(3, n + 1, 2))
    out.append(shaper.chunk(" late", [9], None, False))  # after the final Delta: ignored, as decoded
    return out


def _reads(payloads: list[bytes], seed: int) -> list[list[bytes]]:
    """The payloads cut into reads of 1 to 5 events."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(payloads):
        k = rng.randint(1, 5)
        out.append(payloads[i:i + k])
        i += k
    return out


def _full(reads: list[list[bytes]], chat: bool) -> list[list[Delta]]:
    a = StreamAssembler(chat=chat)
    return [coalesce([d for p in read for d in a.feed(orjson.loads(p))]) for read in reads]


def _spliced(reads: list[list[bytes]], chat: bool) -> tuple[list[list[Delta]], SplicedBatch]:
    batch = SplicedBatch(StreamAssembler(chat=chat))
    out = []
    for read in reads:
        for p in read:
            batch.feed(p)
        out.append(batch.take())
    return out, batch


def _seen(d: Delta) -> tuple[Any, ...]:
    """What a client, the accounting and a resume see of a Delta: the text as the bytes orjson writes, the
    token ids (a lost stream resumes from them) and the prompt's as the worker said, and counts."""
    text = d.text_json if d.text_json is not None else json_body(d.text) if (d.text or d.token_ids) else None
    return (text, tuple(d.token_ids), d.prompt_token_ids, d.completion_tokens, d.finish_reason, d.prompt_tokens,
            d.cached_tokens, d.chat_extra, d.error)


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("ids", [True, False])
@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])  # vLLM and trtllm (pydantic); Python's json
@pytest.mark.parametrize("ascii_only", [True, False])  # the sim escapes non-ASCII; vLLM writes UTF-8
def test_spliced_reads_mean_what_decoded_reads_mean(kind: str, ids: bool, separators: tuple[str, str],
                                                    ascii_only: bool) -> None:
    for seed in range(3):
        payloads = [json.dumps(e, separators=separators, ensure_ascii=ascii_only).encode()
                    for e in _events(kind, ids=ids, seed=seed)]
        reads = _reads(payloads, seed)
        full = _full(reads, kind == "chat")
        spliced, batch = _spliced(reads, kind == "chat")
        assert [[_seen(d) for d in r] for r in spliced] == [[_seen(d) for d in r] for r in full]
        sent = [d for r in spliced for d in r]
        if ids:  # every id the worker sent, in order, and the prompt's once, on the first delta
            assert [t for d in sent for t in d.token_ids] == [t for i in range(60) for t in
                                                              ([100 + i] if i % 9 else [100 + i, 5, 0])] + [7]
            assert sent[0].prompt_token_ids == [1, 2, 3] and all(d.prompt_token_ids is None for d in sent[1:])
        assert batch.spliced > len(payloads) // 2  # the fast path was taken for most events
        assert batch.decoded + batch.spliced == len(payloads) - 1  # the late one is not read at all


def test_a_spliced_text_is_what_orjson_writes() -> None:
    for raw, text in [(b"plain", "plain"), (b"caf\xc3\xa9", "café"), (b"caf\\u00e9", "café"), (b"a\\/b", "a/b"),
                      (b'q\\"', 'q"'), (b"\\n", "\n"), (b"\\ud83d\\ude00", "😀")]:
        assert canonical_body(raw) == json_body(text) == orjson.dumps(text)[1:-1]
    for bad in [b"a\x01b", b'a"b', b"a\\", b"\xff", b"\xed\xa0\x80", b"\\ud800", b"\\x41"]:
        assert canonical_body(bad) is None


def _learned(chat: bool = False) -> tuple[SplicedBatch, bytes]:
    """A batch whose template is learned, and the layout around one text: `{...} % (text, ids)`."""
    batch = SplicedBatch(StreamAssembler(chat=chat))
    key = b'"delta":{"content":"%s"}' if chat else b'"text":"%s"'
    layout = b'{"id":"w","choices":[{"index":0,' + key + b',"logprobs":null,"finish_reason":null,"token_ids":[%s]}]}'
    for i in range(3):
        batch.feed(layout % (b"ok", b"%d" % i))
    batch.take()
    assert batch.spliced == 2
    return batch, layout


@pytest.mark.parametrize("text, ids", [
    (b"a\x01", b"1"),  # a raw control character: not JSON
    (b"\xff", b"1"),  # not UTF-8
    (b'a","evil":"1', b"1"),  # a quote that ends the string early: another shape
    (b"a\\", b"1"),  # the backslash escapes the closing quote
    (b"ok", b"01"), (b"ok", b"-1"), (b"ok", b"1" * 20), (b"ok", b"1,,2"), (b"ok", b"1e3"), (b"ok", b"true"),
])
@pytest.mark.parametrize("chat", [False, True])
def test_hostile_events_in_the_layout_are_not_spliced(text: bytes, ids: bytes, chat: bool) -> None:
    batch, layout = _learned(chat)
    payload = layout % (text, ids)
    reference = StreamAssembler(chat=chat)
    try:
        expected: Any = [_seen(d) for d in coalesce(reference.feed(orjson.loads(payload)))]
    except ValueError:
        expected = ValueError
    try:
        batch.feed(payload)
        got: Any = [_seen(d) for d in batch.take()]
    except ValueError:
        got = ValueError
    assert batch.spliced == 2  # decoded in full: what the full path does with it, it does
    if expected is not ValueError:  # a valid event the splice declined: the same Deltas; the count resumes
        expected = [(t, ids, p, c + 3, *rest) for t, ids, p, c, *rest in expected]
    assert got == expected


@pytest.mark.parametrize("chunk", [
    b'{"choices":[{"index":0,"text":"a","text":"b","logprobs":null,"finish_reason":null}]}',  # a key twice
    b'{"choices":[{"index":0,"text":"b","text":"b","logprobs":null,"finish_reason":null}]}',  # ... same value
    b'{"choices":[{"index":0,"text":"b","logprobs":null,"finish_reason":null,"token_ids":[1],"token_ids":[1]}]}',
    b'{"choices":[{"index":0,"token_ids":[1],"text":"a","logprobs":null,"finish_reason":null}]}',  # ids first
    b'{"choices":[{"index":0,"text":"a","logprobs":{"tokens":["a"]},"finish_reason":null}]}',
    b'{"choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":"stop"}]}',
    b'{"choices":[{"index":1,"text":"a","logprobs":null,"finish_reason":null}]}',
    b'{"choices":[{"index":0,"text":"a"}],"usage":{"prompt_tokens":1}}',
    b'{"choices":[{"index":0,"text":"a"},{"index":1,"text":"b"}]}',
    b'{"choices":[{"index":0,"text":null}]}',
])
def test_no_layout_is_learned_from_a_chunk_that_is_not_plain(chunk: bytes) -> None:
    template = PlainTemplate(chat=False)
    assert not template.learn(chunk, orjson.loads(chunk))
    assert template.match(chunk) is None


def test_parser_output_is_never_learned_and_passes_as_the_full_path_decodes_it() -> None:
    chunk = b'{"choices":[{"index":0,"delta":{"content":"","tool_calls":[{"index":0,"id":"c1"}]}}]}'
    template = PlainTemplate(chat=True)
    assert not template.learn(chunk, orjson.loads(chunk))
    batch, _ = _learned(chat=True)
    batch.feed(chunk)
    (delta,) = batch.take()
    assert delta.chat_extra == {"tool_calls": [{"index": 0, "id": "c1"}]} and delta.text_json is None
