"""The text-in-images tab in a real headless Chromium: an uploaded picture, and one pasted from the
clipboard, go to the `ocr` pipeline as their own bytes in one KServe binary-tensor request; the page
lists the lines the pipeline reads (the same as tritonclient gets for the same bytes) and draws one
box per line; a file that is not an image shows the server's own message."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from playwright.sync_api import Request

from tests.clients.browser import Tab
from tests.integration.ocr_support import PAGES
from tests.servers import Server

pytestmark = pytest.mark.integration

INFER = "/v2/models/ocr/infer"


def model_lines(server: Server, image: bytes) -> list[str]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=300)
    tensor = httpclient.InferInput("IMAGE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([image], dtype=np.object_), binary_data=True)
    return [t.decode() for t in client.infer("ocr", [tensor]).as_numpy("TEXTS")]


def shown_lines(tab: Tab, status: str) -> list[str]:
    tab.until("(s) => document.getElementById('ocr-status').textContent === s", timeout_s=180, arg=status)
    return tab.page.locator("#ocr-lines li .text").all_inner_texts()


def sent_image(request: Request) -> bytes:
    """The image inside a KServe binary request: after the JSON header, a 4-byte length, then the bytes."""
    body = request.post_data_buffer or b""
    header_length = int(request.headers["inference-header-content-length"])
    header = json.loads(body[:header_length])
    assert header["inputs"][0]["datatype"] == "BYTES" and header["inputs"][0]["shape"] == [1]
    size = int.from_bytes(body[header_length:header_length + 4], "little")
    assert header["inputs"][0]["parameters"]["binary_data_size"] == size + 4
    return body[header_length + 4:header_length + 4 + size]


def test_an_uploaded_and_a_pasted_picture_are_read_and_boxed(tab: Tab, ui_server: Server) -> None:
    sent: list[Request] = []
    tab.page.on("request", lambda r: sent.append(r) if r.url.endswith(INFER) else None)
    tab.page.click("#tab-ocr")
    first, second = PAGES[0], PAGES[2]
    image = first.png()
    tab.page.set_input_files("#ocr-upload", files=[{"name": "page.png", "mimeType": "image/png", "buffer": image}])
    expected = model_lines(ui_server, image)
    assert shown_lines(tab, f"{len(expected)} lines") == expected
    assert " ".join(expected) == first.truth
    assert sent_image(sent[-1]) == image
    assert tab.page.locator("#ocr-canvas").get_attribute("data-boxes") == str(len(expected))

    pasted = second.png()
    tab.page.evaluate("""(b64) => {
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      const data = new DataTransfer();
      data.items.add(new File([bytes], "pasted.png", { type: "image/png" }));
      document.dispatchEvent(new ClipboardEvent("paste", { clipboardData: data, bubbles: true }));
    }""", base64.b64encode(pasted).decode())
    expected = model_lines(ui_server, pasted)
    assert shown_lines(tab, f"{len(expected)} lines") == expected
    assert sent_image(sent[-1]) == pasted
    assert not tab.errors, tab.errors


def test_a_file_that_is_not_an_image_shows_the_servers_message(tab: Tab) -> None:
    tab.page.click("#tab-ocr")
    tab.page.set_input_files("#ocr-upload", files=[{"name": "notes.png", "mimeType": "image/png",
                                                     "buffer": b"these are notes, not a picture"}])
    tab.until("() => !document.getElementById('ocr-error').hidden", timeout_s=120)
    assert "not an image" in tab.page.locator("#ocr-error").inner_text()
    assert tab.page.locator("#ocr-lines li").count() == 0
