"""Chat templates are rendered off the event loop within a time limit, and client-supplied
templates are refused unless the operator opts in; on real servers."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.servers import LLM_NAME, Server, llm_only_repository, start_server

pytestmark = pytest.mark.integration

MSG = [{"role": "user", "content": "Hi"}]
LOOPING = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x"
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("templates")
    srv = start_server(["--model-repository", str(llm_only_repository(tmp)), "--allow-client-chat-templates",
                        "--template-timeout-s", "1"], tmp / "server.log")
    yield srv
    srv.stop()


def _chat(server: Server, **extra: object) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", timeout=60,
                      json={"model": LLM_NAME, "messages": MSG, "max_tokens": 2, **extra})


def test_client_templates_are_refused_by_default(llm_server: Server) -> None:
    for extra in ({"chat_template": TEMPLATE}, {"chat_template_kwargs": {"chat_template": TEMPLATE}}):
        r = _chat(llm_server, **extra)
        assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template", r.text
        tok = httpx.post(llm_server.url + "/tokenize", json={"model": LLM_NAME, "messages": MSG, **extra})
        assert tok.status_code == 400
    r = _chat(llm_server, chat_template_kwargs={"tokenize": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"
    assert _chat(llm_server).status_code == 200


def test_opted_in_templates_render_and_a_looping_one_is_cut_off(open_server: Server) -> None:
    tok = httpx.post(open_server.url + "/tokenize", json={"model": LLM_NAME, "messages": MSG,
                                                          "chat_template": TEMPLATE}).json()
    default = httpx.post(open_server.url + "/tokenize", json={"model": LLM_NAME, "messages": MSG}).json()
    assert tok["count"] < default["count"]  # no system prompt, no generation prompt: the client's template ran
    r = _chat(open_server, chat_template=LOOPING)
    assert r.status_code == 400 and "longer than 1 s" in r.json()["error"]["message"]
    # The loop keeps one render thread busy; the event loop is free and other requests are served.
    assert httpx.get(open_server.url + "/health").status_code == 200
    assert _chat(open_server).status_code == 200
    busy = [_chat(open_server, chat_template=LOOPING).status_code for _ in range(4)]
    assert busy.count(400) == 3 and _chat(open_server).status_code == 503  # all four threads stuck: refuse at once
