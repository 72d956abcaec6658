"""What one frontend of `--frontends N` answers for all: merged expositions and summed statistics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from engines.classic.stats import ModelStats, merge_snapshots, snapshot_from_dict, snapshot_to_dict
from gateway.frontends.channel import Peers, exposition, merge_expositions


def _registry(requests: float, queue: float, latencies: list[float]) -> bytes:
    registry = CollectorRegistry()
    c = Counter("demo_requests", "Requests.", ["model", "code"], registry=registry)
    c.labels(model='a "quoted" {model}', code="200").inc(requests)
    Gauge("demo_queue", "Queued now.", registry=registry).set(queue)
    h = Histogram("demo_seconds", "Latency.", ["model"], buckets=(0.1, 1.0), registry=registry)
    for x in latencies:
        h.labels(model="m").observe(x)
    return generate_latest(registry)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if not s.name.endswith("_created")}


def test_merged_exposition_keeps_every_sample_under_its_frontend() -> None:
    parts = {0: _registry(3, 1, [0.05, 2.0]), 1: _registry(4, 5, [0.5])}
    merged = merge_expositions(parts).decode()
    got = _samples(merged)
    for index, part in parts.items():
        for (name, labels), value in _samples(part.decode()).items():
            assert got[(name, tuple(sorted({**dict(labels), "frontend": str(index)}.items())))] == value
    assert len(got) == sum(len(_samples(p.decode())) for p in parts.values())
    families = [f.name for f in text_string_to_metric_families(merged)]
    assert len(families) == len(set(families))  # each family once, its samples together
    assert merged.count("# HELP demo_requests_total") == 1 and merged.count("# TYPE demo_queue gauge") == 1


def test_statistics_sum_and_round_trip() -> None:
    a, b = ModelStats("m", "1"), ModelStats("m", "1")
    for stats, rows in ((a, 3), (b, 5)):
        stats.request_started()
        stats.execution(rows, 1, 1_000, 20_000, 3_000)
        stats.request_done(True, 50_000, 10_000)
    b.request_started()
    b.request_done(False, 7_000, reason="REJECTED")
    sa, sb = a.snapshot(), b.snapshot()
    assert snapshot_from_dict(json.loads(json.dumps(snapshot_to_dict(sb)))) == sb
    total = merge_snapshots([sa, sb])
    assert (total.inference_count, total.execution_count, total.pending_count) == (8, 2, 0)
    assert (total.success.count, total.success.ns, total.fail.count) == (2, 100_000, 1)
    assert set(total.batch_stats) == {3, 5} and total.failures["REJECTED"] == 1
    assert sum(total.phases["request"].counts) == 3
    assert total.last_inference_ms == max(sa.last_inference_ms, sb.last_inference_ms)


def test_a_sibling_that_sends_garbage_or_nothing_is_left_out(tmp_path: Path) -> None:
    async def scenario() -> dict[int, bytes]:
        registry = CollectorRegistry()
        Gauge("demo_up", "Up.", registry=registry).set(1)
        me = Peers(tmp_path, 0, 3, registry, None)
        sibling = Peers(tmp_path, 1, 3, registry, None)
        await me.start()
        await sibling.start()

        async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"\xff\xff\xff\xff")  # claims 4 GiB, sends nothing
            await writer.drain()
            writer.close()
        mute_server = await asyncio.start_unix_server(mute, path=str(tmp_path / "frontend-2.sock"))
        try:
            return await me.ask_all({"op": "metrics"})
        finally:
            mute_server.close()
            await sibling.stop()
            await me.stop()

    answers = asyncio.run(scenario())
    assert set(answers) == {1} and b"demo_up 1.0" in answers[1]


async def test_a_registration_outliving_the_askers_timeout_is_applied_whole(tmp_path: Path, monkeypatch) -> None:
    """The asking sibling stops waiting; the registration it asked for still runs to its end (cut in
    two it would leave models registered with no worker behind them)."""
    import gateway.frontends.channel as channel

    monkeypatch.setattr(channel, "WORKER_TIMEOUT_S", 0.1)
    steps: list[str] = []

    async def on_worker(request: dict) -> dict:
        steps.append("models registered")
        await asyncio.sleep(0.3)  # probing the worker, loading its tokenizer
        steps.append("worker added")
        return {"models": ["m"]}

    registry = CollectorRegistry()
    asked, asker = Peers(tmp_path, 1, 2, registry, None, on_worker), Peers(tmp_path, 0, 2, registry, None)
    await asked.start()
    try:
        answers = await asker.ask_all({"op": "worker", "action": "add"}, timeout_s=0.1)
        assert answers == {}  # it did not answer in time
        for _ in range(100):
            if "worker added" in steps:
                break
            await asyncio.sleep(0.01)
        assert steps == ["models registered", "worker added"]
    finally:
        await asked.stop()


OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"  # Prometheus's


def test_an_openmetrics_scrape_merges_with_its_exemplars_and_one_eof(tmp_path: Path) -> None:
    """A scraper that asks for OpenMetrics gets it from every frontend, exemplars kept under their samples."""
    async def scenario() -> tuple[bytes, str]:
        registries = []
        for index in range(2):
            registry = CollectorRegistry()
            h = Histogram("demo_seconds", "Latency.", ["model"], buckets=(0.1, 1.0), registry=registry)
            h.labels(model="m").observe(0.05 + index, {"trace_id": f"{index:032x}"})
            registries.append(registry)
        me, sibling = Peers(tmp_path, 0, 2, registries[0], None), Peers(tmp_path, 1, 2, registries[1], None)
        await me.start()
        await sibling.start()
        try:
            return await exposition(registries[0], me, OPENMETRICS)
        finally:
            await me.stop()
            await sibling.stop()

    body, content_type = asyncio.run(scenario())
    text = body.decode()
    assert content_type.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n") and text.count("# EOF") == 1
    families = list(openmetrics_families(text))  # parses, EOF included, or raises
    buckets = {(s.labels["frontend"], s.labels["le"]): s for f in families for s in f.samples
               if s.name == "demo_seconds_bucket"}
    assert buckets[("0", "0.1")].exemplar.labels == {"trace_id": f"{0:032x}"}
    assert buckets[("1", "+Inf")].exemplar.labels == {"trace_id": f"{1:032x}"}


def test_a_plain_scrape_stays_prometheus_text(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    Histogram("demo_seconds", "Latency.", registry=registry).observe(0.5, {"trace_id": "ab" * 16})
    body, content_type = asyncio.run(exposition(registry, None, ""))
    assert content_type.startswith("text/plain") and b"# {" not in body and b"# EOF" not in body
