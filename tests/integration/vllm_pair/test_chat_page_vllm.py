"""The chat page served by a gateway in front of real vLLM workers: each reply shows the worker
that served it (X-Sluice-Worker) and the prompt tokens vLLM had cached
(`usage.prompt_tokens_details.cached_tokens`), and prefix routing keeps a conversation on the
worker holding its KV cache."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser

from tests.clients.browser import Tab, chromium, send, settings, wait_reply
from tests.integration.conftest import BLOCK, Worker
from tests.servers import Server

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Per module: see `chromium` for why not per session."""
    with chromium() as b:
        yield b


def test_replies_show_vllms_cached_tokens_and_worker(browser: Browser, gateway: Server, workers: list[Worker]) -> None:
    t = Tab(browser, gateway.url + "/")
    try:
        # A system prompt of several KV blocks, new to every worker (the random tag).
        system = f"[{uuid.uuid4().hex}] " + " ".join(f"Rule {i}: be brief and exact." for i in range(60))
        settings(t, system=system, temperature=0, max_tokens=4, ignore_eos=True)
        send(t, "Hello")
        first = wait_reply(t, 1)
        send(t, "Hello again")
        second = wait_reply(t, 2)
    finally:
        t.close()

    def parsed(stats: str) -> tuple[int, int, str]:
        m = re.search(r"cached (\d+)/(\d+) prompt tokens .* worker (\S+)", stats)
        assert m, stats
        return int(m.group(1)), int(m.group(2)), m.group(3)

    cached1, prompt1, worker1 = parsed(first)
    cached2, prompt2, worker2 = parsed(second)
    assert worker1 in {w.name for w in workers} and worker2 == worker1
    assert cached1 == 0 and prompt1 > 2 * BLOCK
    # The second turn starts with the whole first one: its full blocks were cached.
    assert cached2 >= (prompt1 // BLOCK) * BLOCK and cached2 % BLOCK == 0 and prompt2 > prompt1
