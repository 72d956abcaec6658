"""The chat page in a real headless Chromium against a live gateway: it streams, keeps the
conversation, stops generation on the server, shows the server's errors, and fits a phone."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Request

from tests.clients.browser import PHONE, Tab, send, settings, wait_reply
from tests.servers import LLM_NAME, Server, metric_value

pytestmark = pytest.mark.integration

RUNNING = "sluice_engine_requests_running"
CHAT_PATH = "/v1/chat/completions"
# Records the reply's text length at every DOM change while the reply is still streaming.
WATCH_LENGTHS = """() => {
  window.__lengths = [];
  const messages = document.getElementById("messages");
  new MutationObserver(() => {
    const reply = [...messages.querySelectorAll(".message.assistant")].pop();
    if (reply && reply.classList.contains("streaming")) {
      window.__lengths.push(reply.querySelector(".content").textContent.length);
    }
  }).observe(messages, { childList: true, subtree: true, characterData: true });
}"""


def running(server: Server) -> float | None:
    return metric_value(httpx.get(server.url + "/metrics").text, RUNNING, {"model": LLM_NAME})


def wait_running(tab: Tab, server: Server, value: float, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while running(server) != value:
        assert time.monotonic() < deadline, f"{RUNNING} is not {value} after {timeout_s}s"
        tab.page.wait_for_timeout(100)


def chat_requests(tab: Tab) -> list[Request]:
    sent: list[Request] = []
    tab.page.on("request", lambda r: sent.append(r) if r.url.endswith(CHAT_PATH) else None)
    return sent


def test_page_and_assets_are_served_with_a_strict_csp(ui_server: Server) -> None:
    page = httpx.get(ui_server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "default-src 'none'" in csp
    assets = re.findall(r'(?:src|href)="(ui/[\w.-]+)"', page.text)
    assert {"ui/app.js", "ui/style.css"} <= set(assets)
    for name in ("app.js", "api.js", "chat.js", "markdown.js", "classic.js", "digits.js", "ocr.js"):
        r = httpx.get(f"{ui_server.url}/ui/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript"), name
    missing = httpx.get(ui_server.url + "/ui/..%2Fui.py")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_page_loads_under_its_csp_and_reaches_only_its_origin(browser: Browser, ui_server: Server) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        urls: list[str] = []
        errors: list[str] = []
        page.on("request", lambda r: urls.append(r.url))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(ui_server.url + "/")
        page.locator("#model option").first.wait_for(state="attached")
        assert page.locator("#model").input_value() == LLM_NAME
        assert errors == []  # a CSP violation is reported as a console error
        assert urls and all(u.startswith(ui_server.url + "/") for u in urls), urls
    finally:
        context.close()


def test_reply_streams_token_by_token(tab: Tab, ui_server: Server) -> None:
    settings(tab, temperature=0, max_tokens=48)
    tab.page.evaluate(WATCH_LENGTHS)
    send(tab, "Write a short Python function that adds two numbers.")
    reply = tab.page.locator(".message.assistant").last
    tab.until("() => (window.__lengths || []).some((n) => n > 0)")
    # Text is on screen while the engine is still generating this very request.
    assert running(ui_server) == 1
    tab.screenshot("chat-streaming.png")
    stats = wait_reply(tab, 1)
    final = len(reply.locator(".content").text_content() or "")
    partial = sorted({n for n in tab.page.evaluate("() => window.__lengths") if 0 < n < final})
    assert len(partial) >= 3, partial
    prompt_tokens = httpx.post(ui_server.url + "/tokenize", json={"model": LLM_NAME, "messages": [
        {"role": "user", "content": "Write a short Python function that adds two numbers."}]}).json()["count"]
    assert re.search(r"TTFT \d+\.\d\d s · \d+\.\d tok/s", stats), stats
    assert f"/{prompt_tokens} prompt tokens" in stats and "worker local" in stats, stats
    assert reply.locator("pre code").count() >= 1  # the model's code fence, rendered
    tab.screenshot("chat.png")


def test_conversation_is_sent_back_as_history(tab: Tab, ui_server: Server) -> None:
    sent = chat_requests(tab)
    system = "Answer in one short sentence."
    settings(tab, system=system, temperature=0, max_tokens=8)
    send(tab, "What is the capital of France?")
    first_stats = wait_reply(tab, 1)
    send(tab, "And of Italy?")
    second_stats = wait_reply(tab, 2)
    assert len(sent) == 2
    # Greedy decoding: the same first request, asked again without streaming, gives the reply
    # the page streamed, which must come back as the assistant turn, verbatim.
    replay = httpx.post(ui_server.url + CHAT_PATH, json={**sent[0].post_data_json, "stream": False}, timeout=120)
    first_reply = replay.json()["choices"][0]["message"]["content"]
    assert first_reply
    body: dict[str, Any] = sent[1].post_data_json
    assert body["messages"] == [
        {"role": "system", "content": system},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": first_reply},
        {"role": "user", "content": "And of Italy?"},
    ]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0 and body["max_tokens"] == 8 and body["model"] == LLM_NAME

    def prompt_tokens(stats: str) -> int:
        return int(re.search(r"/(\d+) prompt tokens", stats).group(1))  # type: ignore[union-attr]

    assert prompt_tokens(second_stats) > prompt_tokens(first_stats)


def test_stop_ends_generation_on_the_server(tab: Tab, ui_server: Server) -> None:
    max_tokens = 2000
    settings(tab, temperature=0, max_tokens=max_tokens, ignore_eos=True)
    send(tab, "Count from one to one thousand.")
    reply = tab.page.locator(".message.assistant").last
    tab.until("() => document.querySelector('.message.assistant.streaming .content')?.textContent.length > 0")
    assert running(ui_server) == 1
    tab.page.click("#stop")
    stats = wait_reply(tab, 1, timeout_s=30)
    assert "stopped" in stats and "stopped" in (reply.get_attribute("class") or "")
    # The engine dropped the request: nothing runs, long before 2000 tokens could have been made.
    wait_running(tab, ui_server, 0, timeout_s=30)
    tokens = int(re.search(r"(\d+) tokens", stats).group(1))  # type: ignore[union-attr]
    assert 0 < tokens < max_tokens
    assert tab.page.locator("#send").is_enabled() and tab.page.locator("#stop").is_disabled()


def test_server_errors_are_shown_as_sent(tab: Tab, ui_server: Server) -> None:
    sent = chat_requests(tab)
    settings(tab, max_tokens=10_000_000)
    send(tab, "Hello")
    wait_reply(tab, 1)
    answer = httpx.post(ui_server.url + CHAT_PATH, json=sent[0].post_data_json)
    assert answer.status_code == 400
    shown = tab.page.locator(".message.assistant.failed .error").inner_text()
    assert shown == answer.json()["error"]["message"]


def test_markdown_renderer_escapes_what_it_does_not_render(tab: Tab) -> None:
    hostile = [
        "<img src=x onerror=alert(1)>", "<script>alert(1)</script>", "[x](javascript:alert(1))",
        '[x](https://a.example/" onmouseover="alert(1))', "```\n</code></pre><img src=x onerror=alert(1)>\n```",
        "`<svg onload=alert(1)>`", "**<b onclick=alert(1)>bold</b>**", "| <i>a</i> |\n|---|\n| <iframe> |",
        "> <style>body{display:none}</style>", "- <a href=javascript:alert(1)>x</a>",
    ]
    result = tab.page.evaluate("""async (sources) => {
      const { renderMarkdown } = await import(new URL("ui/markdown.js", location.href));
      return sources.map((src) => {
        const div = document.createElement("div");
        div.innerHTML = renderMarkdown(src);
        const all = [...div.querySelectorAll("*")];
        return {
          text: div.textContent,
          tags: [...new Set(all.map((e) => e.tagName.toLowerCase()))],
          handlers: all.flatMap((e) => [...e.attributes].map((a) => a.name)).filter((n) => n.startsWith("on")),
          hrefs: [...div.querySelectorAll("a")].map((a) => a.getAttribute("href")),
        };
      });
    }""", hostile)
    allowed = {"p", "br", "pre", "code", "strong", "em", "a", "table", "thead", "tbody", "tr", "th", "td",
               "blockquote", "ul", "ol", "li"}
    for src, r in zip(hostile, result, strict=True):
        assert set(r["tags"]) <= allowed and r["handlers"] == [], (src, r)
        assert all(h.startswith("https://") for h in r["hrefs"]), (src, r)
    assert "<img src=x onerror=alert(1)>" in result[0]["text"]
    assert "</code></pre><img src=x onerror=alert(1)>" in result[4]["text"]
    rendered = tab.page.evaluate("""async (src) => {
      const { renderMarkdown } = await import(new URL("ui/markdown.js", location.href));
      return renderMarkdown(src);
    }""", "# T\n\nSee **this** and `x<y`:\n\n```python\nif a < b:\n    pass\n```\n\n1. one\n2. two")
    assert rendered == ('<h1>T</h1><p>See <strong>this</strong> and <code>x&lt;y</code>:</p>'
                        '<pre><code class="language-python">if a &lt; b:\n    pass</code></pre>'
                        '<ol><li>one</li><li>two</li></ol>')


def test_phone_layout_fits_and_chats(browser: Browser, ui_server: Server) -> None:
    t = Tab(browser, ui_server.url + "/", **PHONE)
    try:
        page = t.page
        page.locator("#model option").first.wait_for(state="attached")

        def fits() -> bool:
            """Nothing wider than the screen: not the page, not the conversation, not a message."""
            return bool(page.evaluate("""() => document.documentElement.scrollWidth <= innerWidth
              && [...document.querySelectorAll(".messages")].every((m) => m.scrollWidth <= m.clientWidth)
              && [...document.querySelectorAll(".message")]
                .every((m) => m.getBoundingClientRect().right <= innerWidth)"""))

        assert fits()
        assert not page.locator("#model").is_visible()  # settings folded away on a phone
        page.click("#settings summary")
        assert page.locator("#model").is_visible() and page.locator("#max-tokens").is_visible()
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "8")
        page.click("#settings summary")
        send(t, "Hi! " + "x" * 120)  # one unbroken long word must wrap, not widen the page
        wait_reply(t, 1)
        assert fits()
        for sel in ("#send", "#stop", "#prompt"):
            box = page.locator(sel).bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390 and box["y"] + box["height"] <= 844, sel
        t.screenshot("chat-phone.png")
        page.click("#tab-classic")
        pad = page.locator("#pad").bounding_box()
        assert pad and pad["x"] + pad["width"] <= 390 and fits()
        t.screenshot("classic-phone.png")
    finally:
        t.close()
