"""A stream whose worker is lost mid-answer resumes on another worker (gateway.llm.migration), in
process with scripted engines: what the client sees, what the next worker is asked, what the router
is told, and every case where the stream must end with its error as before."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from engines.base import Delta, EngineRequest, SamplingParams
from engines.errors import ErrorKind, SluiceError
from gateway.llm.dispatch import Dispatch
from gateway.llm.migration import MigrationConfig, Migrator, Sent
from gateway.llm.migration.resume import resume_point
from gateway.llm.targets import Target
from tests.gateway.llm.fakes import FakeEngine, Hooks, dispatch, drain, retryable

# Token id -> bytes of its text. 1..3 are the prompt's; 99 and 100 are the two halves of "é".
VOCAB = {1: b"<s>", 2: b" Tell", 3: b" me", 10: b" Once", 11: b" upon", 12: b" a", 13: b" time", 14: b",",
         15: b" there", 16: b" was", 99: "é".encode()[:1], 100: "é".encode()[1:], 0: b"",
         101: b" " + "é".encode()[:1]}  # a space, then the first byte of "é" (byte-level BPE has such tokens)
EOS = 0


@dataclass
class Detok:
    """A byte-level tokenizer's decode: the bytes of the ids, as UTF-8 with replacement characters."""

    eos_token_id: int | None = EOS
    calls: list[list[int]] = field(default_factory=list)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        self.calls.append(list(ids))
        return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


def said(*ids: int, fault: bool = False) -> list[Delta]:
    """One delta per id (its text and id, counts cumulative), then a lost connection if `fault`."""
    out = [Delta(text=VOCAB[i].decode("utf-8", errors="ignore"), token_ids=[i], completion_tokens=n + 1)
           for n, i in enumerate(ids)]
    if fault:
        out.append(Delta(finish_reason="error", error="worker w failed: connection reset", fault="broken",
                         completion_tokens=len(ids)))
    return out


def finish(*ids: int, reason: str = "length", prompt: int = 0, cached: int | None = None) -> list[Delta]:
    out = said(*ids)
    out.append(Delta(finish_reason=reason, completion_tokens=len(ids), prompt_tokens=prompt,  # type: ignore[arg-type]
                     cached_tokens=cached))
    return out


def migrating(hooks: Hooks, first: FakeEngine, *rest: FakeEngine, max_tokens: int = 8, stop: tuple[str, ...] = (),
              budget: int = 3, chat_body: dict | None = None) -> Dispatch:
    d, _ = dispatch(hooks, [first])
    d.choices[0].request = EngineRequest("r-0", "m", [1, 2, 3], SamplingParams(max_tokens=max_tokens, stop=stop,
                                                                                  temperature=0.0, seed=7),
                                         kind="chat" if chat_body else "completion", chat_body=chat_body)
    def rank(request: EngineRequest) -> list[Target]:
        return [hooks.target(e) for e in (first, *rest)]

    d.migrator = Migrator(MigrationConfig(max_migrations=budget), rank, Detok())
    return d


async def test_a_lost_stream_resumes_on_the_next_worker_with_the_tokens_sent_so_far() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", said(10, 11, 12, fault=True))
    w2 = FakeEngine("w2", finish(13, 14, 15, 16, 0, reason="stop", prompt=6, cached=5))
    d = migrating(hooks, w1, w2)
    text, deltas = await drain(d)
    assert text == " Once upon a time, there was"  # w1's three tokens, then w2's: nothing twice, nothing lost
    assert [x.finish_reason for x in deltas if x.finish_reason] == ["stop"]  # no error reached the client
    resume = w2.seen[0]
    assert resume.kind == "completion" and resume.chat_body is None
    assert resume.prompt_token_ids == [1, 2, 3, 10, 11, 12]  # the prompt, then the tokens already sent
    assert resume.sampling.max_tokens == 8 - 3 and resume.sampling.seed == 7 and resume.sampling.temperature == 0.0
    assert resume.request_id == "r-0~1"
    last = deltas[-1]
    assert last.completion_tokens == 3 + 5 and last.prompt_tokens == 3  # usage counts every token once
    assert last.cached_tokens == 3  # never more than the client's prompt
    assert d.choices[0].completion_tokens == 8
    # The lost attempt is finished as a fault, and the resume is dispatched, answered and finished.
    assert hooks.calls[:2] == [("dispatch", "w1"), ("first_token", "w1")]
    assert hooks.finishes("w1") == [("finish", "w1", None, True, None)]
    assert ("dispatch", "w2") in hooks.calls and hooks.finishes("w2") == [("finish", "w2", 3, False, 8)]
    assert d.metrics.migrations.labels("m", "broken", "resumed")._value.get() == 1
    assert d.metrics.migration_pause.labels("m")._sum.get() >= 0


async def test_the_resume_skips_the_lost_worker_and_marks_it_down() -> None:
    hooks = Hooks()
    downs: list[str] = []
    w1 = FakeEngine("w1", said(10, fault=True))
    w2 = FakeEngine("w2", finish(11, reason="stop"))
    d = migrating(hooks, w1, w2)
    original = d.migrator
    assert original is not None

    def rank(request: EngineRequest) -> list[Target]:  # the router still ranks the lost worker first
        return [Target(e.name, e, on_lost=lambda n=e.name: downs.append(n)) for e in (w1, w2)]

    d.choices[0].targets = [Target("w1", w1, on_lost=lambda: downs.append("w1"))]
    d.migrator = Migrator(original.config, rank, original.tokenizer)
    text, _ = await drain(d)
    assert text == " Once upon" and downs == ["w1"] and w1.requests == ["r-0"] and w2.requests == ["r-0~1"]


async def test_a_raised_fault_after_the_first_delta_resumes_too() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", [*said(10, 11), retryable("the stream broke")])
    w2 = FakeEngine("w2", finish(12, 13))
    text, deltas = await drain(migrating(hooks, w1, w2, max_tokens=4))
    assert text == " Once upon a time" and deltas[-1].finish_reason == "length" and deltas[-1].completion_tokens == 4


async def test_an_error_the_engine_reported_is_not_a_lost_worker() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", [*said(10), Delta(finish_reason="error", error="out of memory for this request")])
    w2 = FakeEngine("w2", finish(11))
    text, deltas = await drain(migrating(hooks, w1, w2))
    assert text == " Once" and deltas[-1].finish_reason == "error" and w2.requests == []


async def test_the_budget_bounds_the_migrations_then_the_error_ends_the_stream() -> None:
    hooks = Hooks()
    w1, w2, w3 = (FakeEngine(n, said(10 + i, fault=True)) for i, n in enumerate(("w1", "w2", "w3")))
    d = migrating(hooks, w1, w2, w3, budget=1)
    text, deltas = await drain(d)
    assert text == " Once upon"  # w1's token, then w2's, then w2 was lost too and the budget was spent
    assert deltas[-1].finish_reason == "error" and deltas[-1].error and w3.requests == []
    assert d.metrics.migrations.labels("m", "broken", "budget_spent")._value.get() == 1


async def test_no_worker_left_ends_the_stream_with_its_error() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", said(10, fault=True))
    d = migrating(hooks, w1)  # the ranking holds only the lost worker
    text, deltas = await drain(d)
    assert text == " Once" and deltas[-1].finish_reason == "error" and w1.requests == ["r-0"]
    assert d.metrics.migrations.labels("m", "broken", "no_worker")._value.get() == 1


async def test_a_stalled_worker_is_resumed_and_counted_as_stalled() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", [*said(10), Delta(finish_reason="error", error="stopped sending", fault="stalled")])
    w2 = FakeEngine("w2", finish(11))
    d = migrating(hooks, w1, w2, max_tokens=2)
    text, _ = await drain(d)
    assert text == " Once upon" and d.metrics.migrations.labels("m", "stalled", "resumed")._value.get() == 1


async def test_when_every_token_was_sent_only_the_final_event_is_made() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", said(10, 11, fault=True))
    w2 = FakeEngine("w2", finish(12))
    text, deltas = await drain(migrating(hooks, w1, w2, max_tokens=2))
    assert text == " Once upon" and w2.requests == []
    assert deltas[-1].finish_reason == "length" and deltas[-1].completion_tokens == 2 and deltas[-1].prompt_tokens == 3


async def test_an_answer_that_ended_on_its_stop_token_is_not_continued() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", said(10, EOS, fault=True))
    w2 = FakeEngine("w2", finish(12))
    text, deltas = await drain(migrating(hooks, w1, w2))
    assert text == " Once" and w2.requests == [] and deltas[-1].finish_reason == "stop"


async def test_a_chat_with_tools_is_not_resumed() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", said(10, fault=True))
    w2 = FakeEngine("w2", finish(11))
    body = {"messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]}
    d = migrating(hooks, w1, w2, chat_body=body)
    _, deltas = await drain(d)
    assert deltas[-1].finish_reason == "error" and w2.requests == []
    assert d.metrics.migrations.labels("m", "broken", "parser_state")._value.get() == 1


async def test_a_worker_that_sends_no_token_ids_is_not_resumed() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", [Delta(text=" Once", completion_tokens=1), said(10, fault=True)[-1]])
    w2 = FakeEngine("w2", finish(11))
    d = migrating(hooks, w1, w2)
    _, deltas = await drain(d)
    assert deltas[-1].finish_reason == "error" and w2.requests == []
    assert d.metrics.migrations.labels("m", "broken", "no_token_ids")._value.get() == 1


async def test_a_chat_resumes_from_the_prompt_the_worker_ran() -> None:
    hooks = Hooks()
    first = said(10, fault=True)
    first[0].prompt_token_ids = [1, 2, 3, 3]  # the worker rendered the chat itself, one token more
    w1, w2 = FakeEngine("w1", first), FakeEngine("w2", finish(11, prompt=5))
    text, deltas = await drain(migrating(hooks, w1, w2, max_tokens=2, chat_body={"messages": []}))
    assert text == " Once upon" and w2.seen[0].prompt_token_ids == [1, 2, 3, 3, 10]
    assert deltas[-1].prompt_tokens == 4


async def test_n_choices_migrate_each_on_its_own() -> None:
    hooks = Hooks()
    lost, kept, spare = FakeEngine("lost", said(10, fault=True)), FakeEngine("kept", finish(12, 13)), \
        FakeEngine("spare", finish(11))
    d, _ = dispatch(hooks, [lost], [kept])
    d.migrator = Migrator(MigrationConfig(), lambda r: [hooks.target(spare)], Detok())
    out: dict[int, str] = {0: "", 1: ""}
    async for i, delta in d.deltas():
        out[i] += delta.text
    assert out == {0: " Once upon", 1: " a time"} and spare.requests == ["r-0~1"] and kept.requests == ["r-1"]


def test_the_tokens_of_a_character_split_at_the_fault_are_generated_again() -> None:
    sent = Sent()
    for delta in said(10, 99):  # " Once", then the first byte of "é": its text is held back
        sent.add(delta, 0.0)
    sent.pieces = [" Once"]
    point = resume_point(Detok(), [1, 2, 3], sent, has_stops=False)
    assert not isinstance(point, str) and point.committed == [10] and point.owed == ""


async def test_whole_characters_sent_before_a_split_one_are_not_sent_twice() -> None:
    """An engine that sends the whole characters of a token ahead of its incomplete last one (the space
    of " \\xc3"): that token is generated again, and the resumed stream drops what the client has."""
    hooks = Hooks()
    lost = [*said(10), Delta(text=" ", token_ids=[101], completion_tokens=2), Delta(fault="broken")]
    again = [Delta(text=" ", token_ids=[101], completion_tokens=1),
             Delta(text="é", token_ids=[100], completion_tokens=2),
             Delta(finish_reason="length", completion_tokens=2, prompt_tokens=4)]
    w1, w2 = FakeEngine("w1", lost), FakeEngine("w2", again)
    text, deltas = await drain(migrating(hooks, w1, w2, max_tokens=3))
    assert text == " Once é" and w2.seen[0].prompt_token_ids == [1, 2, 3, 10]
    assert deltas[-1].finish_reason == "length" and deltas[-1].completion_tokens == 3
    # Sampled, the token might not come again as it was: the client's space could not be taken back.
    sent = Sent()
    for delta in lost[:-1]:
        sent.add(delta, 0.0)
    assert resume_point(Detok(), [1, 2, 3], sent, has_stops=False, greedy=False) == "text_mismatch"


def test_text_held_back_behind_whole_tokens_is_owed_unless_a_stop_string_may_be_pending() -> None:
    sent = Sent()
    for delta in said(10, 11):
        sent.add(delta, 0.0)
    sent.pieces = [" Once"]  # " upon" was held back (a stop string might have started)
    point = resume_point(Detok(), [1, 2, 3], sent, has_stops=False)
    assert not isinstance(point, str) and point.committed == [10, 11] and point.owed == " upon"
    # With stop strings the held-back tokens are generated again instead: the next worker sees them.
    point = resume_point(Detok(), [1, 2, 3], sent, has_stops=True)
    assert not isinstance(point, str) and point.committed == [10] and point.owed == ""
    sent.pieces = [" Onc"]  # held back inside a token: no boundary where the texts agree
    assert resume_point(Detok(), [1, 2, 3], sent, has_stops=True) == "stop_pending"


def test_text_the_ids_do_not_explain_is_refused() -> None:
    sent = Sent()
    sent.add(Delta(text=" Twice", token_ids=[10], completion_tokens=1), 0.0)
    assert resume_point(Detok(), [1, 2, 3], sent, has_stops=False) == "text_mismatch"


def test_a_config_out_of_bounds_is_refused() -> None:
    for bad in ({"max_migrations": -1}, {"max_migrations": 17}, {"max_replay_tokens": 0}):
        try:
            MigrationConfig(**bad)  # type: ignore[arg-type]
        except ValueError:
            continue
        raise AssertionError(f"{bad} was accepted")



async def test_logprobs_already_sent_for_tokens_to_generate_again_refuse_the_move() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", said(10, 99, fault=True))  # the fault splits "é": 99 would be generated again
    w1.script[1].text = ""  # its text held back, as an engine does
    w2 = FakeEngine("w2", finish(100))
    d = migrating(hooks, w1, w2)
    d.choices[0].request.sampling = SamplingParams(max_tokens=8, temperature=0.0, logprobs=1)
    _, deltas = await drain(d)
    assert deltas[-1].finish_reason == "error" and w2.requests == []
    assert d.metrics.migrations.labels("m", "broken", "logprobs_sent")._value.get() == 1


async def test_without_logprobs_a_split_character_is_generated_again() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", said(10, 99, fault=True))
    w1.script[1].text = ""
    w2 = FakeEngine("w2", finish(99, 100))
    _, deltas = await drain(migrating(hooks, w1, w2, max_tokens=3))
    assert w2.seen[0].prompt_token_ids == [1, 2, 3, 10] and w2.seen[0].sampling.max_tokens == 2
    assert deltas[-1].completion_tokens == 3 and deltas[-1].finish_reason == "length"


async def test_a_second_move_replays_each_token_once() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", said(10, 99, fault=True))  # lost inside "é": 99 is generated again by w2
    w1.script[1].text = ""
    w2 = FakeEngine("w2", [*said(99, 100, 11), said(0, fault=True)[-1]])
    w2.script[0].text = ""
    w2.script[1].text = "é"
    w3 = FakeEngine("w3", finish(12))
    text, deltas = await drain(migrating(hooks, w1, w2, w3, max_tokens=5))
    assert text == " Onceé upon a" and w3.seen[0].prompt_token_ids == [1, 2, 3, 10, 99, 100, 11]
    assert deltas[-1].completion_tokens == 5


async def test_an_interrupt_that_comes_with_the_fault_opens_no_resume() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", said(10, fault=True))
    w2 = FakeEngine("w2", finish(11))
    d = migrating(hooks, w1, w2)
    stop = SluiceError("shutting down", ErrorKind.UNAVAILABLE)
    seen = []
    with pytest.raises(SluiceError, match="shutting down"):
        async for _, delta in d.deltas():
            seen.append(delta.text)
            await d.interrupt(stop)
    assert seen == [" Once"] and w2.requests == []


async def test_a_resume_refused_before_its_first_byte_does_not_mark_that_worker_down() -> None:
    hooks = Hooks()
    downs: list[str] = []
    w1 = FakeEngine("w1", said(10, fault=True))
    busy = FakeEngine("busy", [SluiceError("overloaded", ErrorKind.UNAVAILABLE, retryable=True)])
    w3 = FakeEngine("w3", finish(11))
    d = migrating(hooks, w1)
    original = d.migrator
    assert original is not None
    d.choices[0].targets = [Target("w1", w1, on_lost=lambda: downs.append("w1"))]

    def rank(request: EngineRequest) -> list[Target]:  # one target a time: the refusal is the attempt's last
        return [Target(e.name, e, on_lost=lambda n=e.name: downs.append(n)) for e in (busy, w3)
                if e.name not in d.choices[0].lost and not (e is w3 and not busy.requests)][:1]

    d.migrator = Migrator(original.config, rank, original.tokenizer)
    text, _ = await drain(d)
    assert text == " Once upon" and downs == ["w1"] and busy.requests == ["r-0~1"] and w3.requests == ["r-0~2"]
