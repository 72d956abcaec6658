"""Dispatch in-process, with scripted engines: failover before the first delta only, and
each attempt's `on_finish` called exactly once however the request ends."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

import pytest

from engines.base import Delta
from engines.errors import ErrorKind, SluiceError
from gateway.llm.admission import AdmissionConfig
from tests.gateway.llm.fakes import HANG, FakeEngine, Hooks, dispatch, drain, make_model, retryable, tokens

# Bounds a wait on a fake that should already be done, so a regression fails instead of hanging.
_STUCK_S = 5.0


async def _until(done: Callable[[], object]) -> None:
    """Let the loop run until `done()` (at most 100 turns: scheduled closes run within a few)."""
    for _ in range(100):
        if done():
            return
        await asyncio.sleep(0)


async def test_error_before_first_delta_fails_over_to_the_next_target() -> None:
    hooks = Hooks()
    w1, w2 = FakeEngine("w1", [retryable()]), FakeEngine("w2", tokens("hel", "lo", cached=2))
    d, model = dispatch(hooks, [w1, w2])
    text, deltas = await drain(d)
    assert text == "hello"
    assert deltas[-1].finish_reason == "stop"
    assert w1.requests == w2.requests == ["r-0"]  # the same engine request id on both
    # The failed attempt is closed (a worker fault) before the next one opens.
    assert hooks.calls == [("dispatch", "w1"), ("finish", "w1", None, True, None),
                           ("dispatch", "w2"), ("first_token", "w2"), ("finish", "w2", 2, False, 2)]
    assert d.worker == "w2" and d.closed and model.admission.running == 0


async def test_error_after_first_delta_ends_the_stream_without_failover() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", [Delta(text="hel", token_ids=[7]), retryable("the stream broke")])
    w2 = FakeEngine("w2", tokens("other"))
    d, _ = dispatch(hooks, [w1, w2])
    texts = []
    with pytest.raises(SluiceError, match="the stream broke"):
        async for _, delta in d.deltas():
            texts.append(delta.text)
    assert texts == ["hel"]  # the client already has w1's text: w2 must not add its own
    assert w2.requests == []
    assert hooks.of("dispatch") == ["w1"]
    assert hooks.finishes() == [("finish", "w1", None, True, None)]


async def test_error_delta_after_first_delta_is_the_last_delta() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", [Delta(text="hel", token_ids=[7]), Delta(finish_reason="error", error="oom")])
    w2 = FakeEngine("w2", tokens("other"))
    d, _ = dispatch(hooks, [w1, w2])
    text, deltas = await drain(d)
    assert text == "hel" and deltas[-1].finish_reason == "error"
    assert w2.requests == []
    assert hooks.finishes() == [("finish", "w1", None, True, None)]  # a fault, and no answer length


async def test_a_refusal_that_is_not_retryable_does_not_fail_over() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", [SluiceError("bad grammar", ErrorKind.INVALID_ARG)])
    w2 = FakeEngine("w2", tokens("other"))
    d, model = dispatch(hooks, [w1, w2])
    with pytest.raises(SluiceError, match="bad grammar"):
        await drain(d)
    assert w2.requests == []
    assert hooks.finishes() == [("finish", "w1", None, False, None)]  # the worker rightly refused
    assert d.closed and model.admission.running == 0


async def test_when_every_target_fails_the_last_error_is_raised() -> None:
    hooks = Hooks()
    w1, w2 = FakeEngine("w1", [retryable("w1 down")]), FakeEngine("w2", [retryable("w2 down")])
    d, _ = dispatch(hooks, [w1, w2])
    with pytest.raises(SluiceError, match="w2 down"):
        await drain(d)
    assert hooks.finishes() == [("finish", "w1", None, True, None), ("finish", "w2", None, True, None)]


async def test_normal_finish_closes_once() -> None:
    hooks = Hooks()
    d, model = dispatch(hooks, [FakeEngine("w1", tokens("a", "b", cached=5))])
    closes: list[int] = []
    d.on_close = closes.append
    await drain(d)
    d.close()  # every protocol edge closes again when its response ends
    assert hooks.finishes() == [("finish", "w1", 5, False, 2)]
    assert closes == [2]
    assert model.admission.running == 0


async def test_interrupt_mid_stream_aborts_and_finishes_once() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", [Delta(text="a", token_ids=[1]), HANG])
    d, model = dispatch(hooks, [w1])
    got: list[Delta] = []

    async def consume() -> None:
        async for _, delta in d.deltas():
            got.append(delta)

    task = asyncio.create_task(consume())
    await asyncio.wait_for(w1.hanging.wait(), _STUCK_S)
    await d.interrupt(SluiceError("the server is draining", ErrorKind.UNAVAILABLE))
    with pytest.raises(SluiceError, match="draining"):
        await asyncio.wait_for(task, _STUCK_S)
    assert [x.text for x in got] == ["a"]  # the engine's "abort" delta is not relayed
    assert w1.aborted == ["r-0"]
    assert hooks.finishes() == [("finish", "w1", None, False, None)]
    assert d.closed and model.admission.running == 0


async def test_interrupt_while_queued_finishes_the_attempt_without_running_it() -> None:
    hooks = Hooks()
    model = make_model(None, admission=AdmissionConfig(max_running=1, max_queued=1))
    holder = model.admission.try_admit()
    w1 = FakeEngine("w1", tokens("a"))
    d, _ = dispatch(hooks, [w1], model=model)
    task = asyncio.create_task(drain(d))
    await asyncio.sleep(0)  # the consumer is now waiting for admission
    await d.interrupt(SluiceError("the server is draining", ErrorKind.UNAVAILABLE))
    with pytest.raises(SluiceError, match="draining"):
        await asyncio.wait_for(task, _STUCK_S)
    assert w1.requests == []
    # The router was told at ranking time; it hears the end of that attempt exactly once.
    assert hooks.calls == [("dispatch", "w1"), ("finish", "w1", None, False, None)]
    assert model.admission.queued == 0
    holder.release()


async def test_client_disconnect_closes_the_engine_stream_and_finishes_once() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", [Delta(text="a", token_ids=[1]), HANG])
    d, model = dispatch(hooks, [w1])
    closes: list[int] = []
    d.on_close = closes.append
    stream = d.deltas()
    assert (await anext(stream))[1].text == "a"
    await stream.aclose()  # what a streaming response does when its client goes away
    d.close()
    assert hooks.finishes() == [("finish", "w1", None, False, None)]  # leaving is not the worker's fault
    assert closes == [1]  # charged for the token it used
    assert model.admission.running == 0
    # With one choice, merge() does not close its inner stream itself: the loop's async-generator
    # finalizer does, a turn later. The engine's stream must end all the same.
    await _until(lambda: w1.ended)
    assert w1.ended == ["r-0"]
    assert len(hooks.finishes()) == 1


async def test_abandoned_stream_is_finished_when_collected() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", [Delta(text="a", token_ids=[1]), HANG])
    d, model = dispatch(hooks, [w1])
    stream = d.deltas()
    await anext(stream)
    del stream  # the consumer stops iterating and drops it: the loop's finalizer closes it
    gc.collect()
    await _until(lambda: d.closed and w1.ended)
    assert d.closed
    assert w1.ended == ["r-0"]
    assert hooks.finishes() == [("finish", "w1", None, False, None)]
    assert model.admission.running == 0


async def test_close_without_consuming_finishes_every_choice_once() -> None:
    hooks = Hooks()
    w1, w2 = FakeEngine("w1", tokens("a")), FakeEngine("w2", tokens("b"))
    d, model = dispatch(hooks, [w1], [w2])  # two choices (n=2), one target each
    d.close()
    d.close()
    assert w1.requests == w2.requests == []
    assert hooks.calls == [("dispatch", "w1"), ("dispatch", "w2"),
                           ("finish", "w1", None, False, None), ("finish", "w2", None, False, None)]
    assert model.admission.running == 0


async def test_disconnect_with_several_choices_finishes_each_once() -> None:
    hooks = Hooks()
    w1 = FakeEngine("w1", [Delta(text="a", token_ids=[1]), HANG])
    w2 = FakeEngine("w2", [Delta(text="b", token_ids=[2]), HANG])
    d, _ = dispatch(hooks, [w1], [w2])
    stream = d.deltas()
    await anext(stream)
    await asyncio.wait_for(asyncio.gather(w1.hanging.wait(), w2.hanging.wait()), _STUCK_S)
    await stream.aclose()
    assert sorted(w1.ended + w2.ended) == ["r-0", "r-1"]
    assert sorted(hooks.finishes()) == [("finish", "w1", None, False, None), ("finish", "w2", None, False, None)]
    assert d.closed


async def test_a_stream_that_answered_holds_the_first_ranked_and_the_current_target_only() -> None:
    """Not one target per worker for its whole life: each holds the router's ranking."""
    hooks = Hooks()
    w1, w3 = FakeEngine("w1", [retryable()]), FakeEngine("w3", tokens("x"))
    w2 = FakeEngine("w2", [Delta(text="a", token_ids=[1]), HANG])
    d, _ = dispatch(hooks, [w1, w2, w3])
    stream = d.deltas()
    await anext(stream)  # w1 failed over to w2, which answered
    targets = d.choices[0].targets
    assert [t.name for t in targets] == ["w1", "w2"] and d.worker == "w2"
    assert all(t.on_dispatch is None for t in targets)  # called already; they held the ranking
    await stream.aclose()
    assert hooks.calls == [("dispatch", "w1"), ("finish", "w1", None, True, None), ("dispatch", "w2"),
                           ("first_token", "w2"), ("finish", "w2", None, False, None)]
    d2, _ = dispatch(Hooks(), [FakeEngine("w1", [Delta(text="a", token_ids=[1]), HANG]), w3])
    stream = d2.deltas()
    await anext(stream)
    assert [t.name for t in d2.choices[0].targets] == ["w1"]
    await stream.aclose()
