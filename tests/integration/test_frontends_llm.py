"""`sluice serve --frontends 2` serving LLM traffic from real sim workers: one routing picture,
one set of quotas, one answer to /metrics and /v1/models, whichever frontend a request reaches.

Two sim fleets of two workers each: `ne-*` (no KV events: the frontends know where a prompt went
only from each other's speculative index entries), listed with `--worker`, and `ev-*` (KV
events), which register themselves through the gateway, so their registration reaches one
frontend and must reach both. Every request names the frontend that answered it
(X-Sluice-Frontend), and the tests choose the frontend (frontends_support).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import psutil
import pytest

from router.index.hashing import rendezvous_score
from tests.integration.conftest import MODEL
from tests.integration.frontends_support import on, samples, stream_on
from tests.integration.test_sim_fleet import _free_run
from tests.integration.vllm_support import ROOT, tiny_llama_dir, wait_healthy
from tests.servers import Server, free_port, start_server, until

pytestmark = pytest.mark.integration

APPROX = "tiny-llama-approx"  # the model of the fleet without KV events
SEQS = 8  # --max-num-seqs of every sim worker: a model's capacity is 2 x 8
PROFILE = "base_s=0.02,prefill_token_s=0.0002"  # a prefill costs: a cached prefix is worth a worker
KEYS = {"open": "sk-frontends-open-0123456789", "pair": "sk-frontends-pair-0123456789",
        "four": "sk-frontends-four-0123456789"}
KEYS_FILE = f"""
- {{id: open, key: {KEYS['open']}}}
- {{id: pair, key: {KEYS['pair']}, concurrency: 2}}
- {{id: four, key: {KEYS['four']}, rpm: 4}}
"""


@dataclass
class Stack:
    gateway: Server
    fleets: list[subprocess.Popen[bytes]]

    @property
    def url(self) -> str:
        return self.gateway.url


def auth(key: str = "open") -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[key]}"}


def _fleet(name: str, model: str, port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim", "--model", str(tiny_llama_dir()),
         "--served-model-name", model, "--port", str(port), "--replicas", "2", "--name", name,
         "--profile", PROFILE, "--max-num-seqs", str(SEQS), *extra], cwd=ROOT, start_new_session=True)


def workers_on(stack: Stack, frontend: int) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in on(stack.url, frontend, "GET", "/v1/admin/workers").json()["data"]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("frontends-llm")
    (tmp / "repo").mkdir()
    (tmp / "keys.yaml").write_text(KEYS_FILE)
    ne_port, ev_port, kv_port = _free_run(2), _free_run(2), _free_run(4)
    fleets = [_fleet("ne", APPROX, ne_port, ["--no-kv-events"])]
    gateway = None
    try:
        for i in range(2):
            wait_healthy(f"http://127.0.0.1:{ne_port + i}", fleets[0])
        gateway = start_server(["--model-repository", str(tmp / "repo"), "--frontends", "2", "--api-keys-file",
                                str(tmp / "keys.yaml"), "--metrics-port", str(free_port()),
                                *(f"--worker=ne-{i}=http://127.0.0.1:{ne_port + i}" for i in range(2))],
                               tmp / "gateway.log")
        fleets.append(_fleet("ev", MODEL, ev_port, ["--kv-events-port", str(kv_port), "--gateway", gateway.url]))
        stack = Stack(gateway, fleets)
        for frontend in (0, 1):  # registered through one frontend, known to both
            until(lambda f=frontend: len(workers_on(stack, f)) == 4, f"frontend {frontend} lists 4 workers", 120)
        yield stack
    finally:
        for proc in fleets:
            proc.send_signal(signal.SIGTERM)
        for proc in fleets:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        if gateway is not None:
            gateway.stop()


def complete(stack: Stack, frontend: int, prompt: list[int], *, model: str = MODEL, key: str = "open",
             headers: dict[str, str] | None = None, max_tokens: int = 2) -> httpx.Response:
    return on(stack.url, frontend, "POST", "/v1/completions", headers={**auth(key), **(headers or {})},
              json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True})


# -- one routing picture --------------------------------------------------------------------------
def test_a_conversation_keeps_its_worker_whichever_frontend_takes_each_turn(stack: Stack) -> None:
    """`ne-*` send no KV events: only the speculative entries the frontends share say where a turn went.
    Before each second turn, frontend 1 sends a long prompt to the conversation's worker: a frontend
    that did not know where the first turn went would now send the second to the other worker, the
    one it gave less prefill work."""
    homes = set()
    for conversation in range(4):
        prompt = [(97 * conversation + 31 * i) % 30000 + 100 for i in range(600)]
        seen: list[str] = []
        why: list[tuple[str, str, str]] = []  # (frontend, route reason, predicted cached tokens) of each turn
        for turn in range(4):
            prompt += [(conversation * 7 + turn * 11 + i) % 30000 + 100 for i in range(60)]
            r = complete(stack, turn % 2, prompt, model=APPROX)
            assert r.status_code == 200, r.text
            seen.append(r.headers["x-sluice-worker"])
            why.append((r.headers["x-sluice-frontend"], r.headers["x-sluice-route-reason"],
                        r.headers["x-sluice-predicted-cached-tokens"]))
            time.sleep(0.3)  # a user's pause between turns: the frontends exchange state every 50 ms
            if turn == 0:
                key = next(f"ballast-{conversation}-{n}" for n in range(1000)
                           if max(("ne-0", "ne-1"), key=lambda w, n=n: rendezvous_score(
                               f"ballast-{conversation}-{n}", w)) == seen[0])
                ballast = [(13 * conversation + 7 * i) % 30000 + 5000 for i in range(1500)]
                r = complete(stack, 1, ballast, model=APPROX, max_tokens=1,
                             headers={"X-Routing-Policy": "session", "X-Session-Id": key})
                assert r.headers["x-sluice-worker"] == seen[0], r.headers
        assert len(set(seen)) == 1, f"conversation {conversation} moved: {seen} {why}"
        homes.add(seen[0])
    assert homes == {"ne-0", "ne-1"}  # both workers hold conversations: each kept its own


def test_load_placed_by_one_frontend_steers_the_others_choice(stack: Stack) -> None:
    long = {"model": MODEL, "prompt": [5] * 40, "max_tokens": 400, "ignore_eos": True}
    sticky = {**auth(), "X-Routing-Policy": "session", "X-Session-Id": "one-busy-worker"}
    with ExitStack() as held:
        busy = {held.enter_context(stream_on(stack.url, 0, long, sticky)).headers["x-sluice-worker"]
                for _ in range(3)}
        assert len(busy) == 1
        worker = busy.pop()
        until(lambda: workers_on(stack, 1)[worker]["in_flight"] == 3, "frontend 1 counts frontend 0's streams")
        for k in range(4):  # every choice frontend 1 makes avoids the worker frontend 0 keeps busy
            # ...when it has another to choose: a health check that timed out on a starved machine
            # takes an idle worker out for a while (product behaviour, not what this test is about).
            until(lambda: all(w["healthy"] and not w["draining"] and w["breaker"] == "closed"
                              for w in workers_on(stack, 1).values() if MODEL in w["models"]),
                  "frontend 1 sees every worker of the model healthy")
            view = workers_on(stack, 1)
            r = complete(stack, 1, [300 + k] * 40, headers={"X-Routing-Policy": "least_load"})
            assert r.status_code == 200 and r.headers["x-sluice-worker"] != worker, (k, r.headers, view)
    until(lambda: all(w["in_flight"] == 0 for w in workers_on(stack, 1).values()), "the streams end everywhere")


def test_each_frontend_applies_the_kv_events_itself_and_they_learn_as_one(stack: Stack) -> None:
    for k in range(4):  # answers of 17 tokens, all seen by frontend 0 only
        assert complete(stack, 0, [700 + k] * 200, max_tokens=17).status_code == 200

    def learned() -> dict[str, float]:
        text = on(stack.url, 1, "GET", "/metrics").text
        return {dict(k)["frontend"]: v for k, v in samples(text, "sluice_router_answer_tokens").items()
                if dict(k)["model"] == MODEL}
    until(lambda: len(set(learned().values())) == 1 and len(learned()) == 2, "both frontends learn one answer "
          f"length (now {learned()})")
    events = samples(on(stack.url, 0, "GET", "/metrics").text, "sluice_router_kv_events_total")
    for frontend in ("0", "1"):
        assert sum(v for k, v in events.items() if dict(k)["frontend"] == frontend) > 0, events


# -- one set of quotas ----------------------------------------------------------------------------
def _refused(r: httpx.Response, what: str) -> None:
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded") and what in error["message"]


def test_a_concurrency_quota_holds_across_both_frontends(stack: Stack) -> None:
    long = {"model": MODEL, "prompt": [6] * 40, "max_tokens": 400, "ignore_eos": True}
    with ExitStack() as held:
        for frontend in (0, 1):  # one request of key `pair` in flight on each frontend: its 2
            held.enter_context(stream_on(stack.url, frontend, long, auth("pair")))
        for frontend in (0, 1):  # the third is refused, whichever frontend takes it
            _refused(complete(stack, frontend, [7] * 20, key="pair"), "2 concurrent requests")
    until(lambda: complete(stack, 0, [7] * 20, key="pair").status_code == 200, "the slots are free again")


def test_a_requests_per_minute_quota_holds_across_both_frontends(stack: Stack) -> None:
    for frontend in (0, 1, 0, 1):
        r = complete(stack, frontend, [8] * 20, key="four")
        assert r.status_code == 200, r.text
    for frontend in (0, 1):
        _refused(complete(stack, frontend, [8] * 20, key="four"), "4 requests per minute")


# -- one answer to /metrics and /v1/models --------------------------------------------------------
def test_metrics_and_models_answer_the_same_from_either_frontend(stack: Stack) -> None:
    for frontend in (0, 1):
        assert complete(stack, frontend, [10] * 20).status_code == 200
    models = [on(stack.url, f, "GET", "/v1/models", headers=auth()).json() for f in (0, 1)]
    assert models[0] == models[1] and {m["id"] for m in models[0]["data"]} == {MODEL, APPROX}
    every = [(f, w) for f in ("0", "1") for w in ("ev-0", "ev-1", "ne-0", "ne-1")]

    def healthy(text: str) -> list[tuple[str, str]]:
        found = samples(text, "sluice_router_worker_healthy")
        return sorted((dict(k)["frontend"], dict(k)["worker"]) for k, v in found.items() if v == 1)
    texts: list[str] = []

    def scrape() -> bool:
        texts[:] = [on(stack.url, f, "GET", "/metrics").text for f in (0, 1)]
        return [healthy(t) for t in texts] == [every] * 2
    # Each frontend sets the gauge on its next health round after a worker registered.
    until(scrape, "both frontends report every worker healthy")
    for name in ("sluice_model_capacity", "sluice_router_worker_healthy", "sluice_requests_inflight_limit"):
        scraped = [samples(t, name) for t in texts]
        assert scraped[0] == scraped[1], name
    capacity = samples(texts[0], "sluice_model_capacity")
    for model in (MODEL, APPROX):  # each frontend admits its share; the shares add up to the fleet's
        shares = {dict(k)["frontend"]: v for k, v in capacity.items() if dict(k)["model"] == model}
        assert shares == {"0": SEQS, "1": SEQS}, capacity
    for f in (0, 1):  # each scrape counts the requests both frontends answered
        counts = samples(texts[f], "sluice_requests_total")
        assert {dict(k)["frontend"] for k, v in counts.items() if dict(k)["model"] == MODEL and v} == {"0", "1"}


def test_a_drain_through_one_frontend_reaches_the_other(stack: Stack) -> None:
    assert on(stack.url, 0, "POST", "/v1/admin/workers/ev-1/drain").json() == {"name": "ev-1", "draining": True}
    assert workers_on(stack, 1)["ev-1"]["draining"] is True
    assert on(stack.url, 1, "POST", "/v1/admin/workers/ev-1/drain?undo=1").json()["draining"] is False
    assert workers_on(stack, 0)["ev-1"]["draining"] is False


def test_a_restarted_frontend_restores_the_registrations_it_missed(stack: Stack) -> None:
    victim = psutil.Process(stack.gateway.proc.pid).children()[0]
    victim.kill()
    victim.wait(10)
    until(lambda: len(psutil.Process(stack.gateway.proc.pid).children()) == 2, "the supervisor restarts it")
    for frontend in (0, 1):  # the restarted one listens only once it has restored ev-0 and ev-1
        assert sorted(workers_on(stack, frontend)) == ["ev-0", "ev-1", "ne-0", "ne-1"]
    assert complete(stack, 0, [9] * 20).status_code == 200 and complete(stack, 1, [9] * 20).status_code == 200
