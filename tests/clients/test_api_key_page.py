"""The page against a gateway with API keys on: it asks for a key, shows the server's own 401
message for a missing or wrong key, sends the key as a bearer token on every route it calls
(OpenAI and KServe), and keeps it in this tab's sessionStorage only.

Built against the keys contract (`SLUICE_API_KEYS`; 401 with OpenAI's error JSON and
`WWW-Authenticate: Bearer`), which lands with the security work. The page itself and its
assets (`/`, `/ui/*`) must stay open with keys on: a browser cannot send a bearer token
when it navigates."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Request

from tests.clients.browser import Tab
from tests.clients.conftest import DIGITS_MODELS
from tests.clients.images import png, sklearn_pixels
from tests.servers import DEFAULT_REPO, Server, start_server

pytestmark = pytest.mark.integration

RIGHT = "sk-frontend-test-right-5b0f3c1e9d2a4786"
WRONG = "sk-frontend-test-wrong-00000000000000"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Keys on; the digits models only (no LLM), so it starts in seconds."""
    tmp = tmp_path_factory.mktemp("keyed")
    repo = tmp / "repo"
    for name in DIGITS_MODELS:
        shutil.copytree(DEFAULT_REPO / name, repo / name)
    server = start_server(["--model-repository", str(repo)], tmp / "server.log", env={"SLUICE_API_KEYS": RIGHT})
    yield server
    server.stop()


def refusal(server: Server, key: str | None) -> str:
    """The server's own message for this key (None: no key), checked against the contract."""
    r = httpx.get(server.url + "/v1/models", headers={"authorization": f"Bearer {key}"} if key else {})
    assert r.status_code == 401 and r.headers["www-authenticate"].lower().startswith("bearer")
    return r.json()["error"]["message"]


def test_wrong_key_shows_the_servers_error_and_the_right_one_is_used(browser: Browser, keyed_server: Server) -> None:
    page_response = httpx.get(keyed_server.url + "/")
    assert page_response.status_code == 200, "the page must load without a key (a navigation sends none)"
    without_key, wrong_key = refusal(keyed_server, None), refusal(keyed_server, WRONG)

    t = Tab(browser, keyed_server.url + "/")
    try:
        page = t.page
        sent: list[Request] = []
        page.on("request", lambda r: sent.append(r) if "/v1/" in r.url or "/v2/" in r.url else None)
        page.locator("#key-panel").wait_for(state="visible")
        assert page.locator("#key-error").inner_text() == without_key

        page.fill("#key-input", WRONG)
        page.click("#key-save")
        page.locator("#key-error").filter(has_text=wrong_key).wait_for()
        assert sent[-1].headers["authorization"] == f"Bearer {WRONG}"
        assert page.locator("#key-panel").is_visible()

        page.fill("#prompt", "Hello")  # a chat with the wrong key shows the same refusal, as sent
        page.click("#send")
        page.locator(".message.assistant.failed .error").wait_for()
        assert page.locator(".message.assistant.failed .error").inner_text() == wrong_key

        page.fill("#key-input", RIGHT)
        page.click("#key-save")
        page.locator("#key-panel").wait_for(state="hidden")
        assert page.evaluate("() => [sessionStorage.getItem('sluice.apiKey'), localStorage.length]") == [RIGHT, 0]

        # KServe calls carry the key too.
        page.click("#tab-classic")
        ink = sklearn_pixels(0)
        page.set_input_files("#upload", files=[{"name": "zero.png", "mimeType": "image/png",
                                                "buffer": png(255 - ink, scale=8)}])
        page.locator("#digit-label[data-label='zero']").wait_for()
        infer = [r for r in sent if r.url.endswith("/v2/models/digits_ensemble/infer")]
        assert infer and infer[-1].headers["authorization"] == f"Bearer {RIGHT}"

        # sessionStorage is this tab's: a second tab asks again.
        other = t.context.new_page()
        other.goto(keyed_server.url + "/")
        other.locator("#key-panel").wait_for(state="visible")
    finally:
        t.close()
