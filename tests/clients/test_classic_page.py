"""The digits tab in a real headless Chromium: an uploaded scikit-learn digit and a digit drawn
with the mouse reach digits_ensemble as scikit-learn's 8x8 convention (0 background, ink high),
and the page shows the label the model gives over tritonclient for the same pixels."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tritonclient.http as httpclient
from playwright.sync_api import Request
from sklearn.datasets import load_digits

from tests.clients.browser import Tab
from tests.clients.images import png, sklearn_pixels
from tests.servers import Server

pytestmark = pytest.mark.integration

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
INFER = "/v2/models/digits_ensemble/infer"
# Strokes in pad fractions (x, y), drawn with the mouse as a person would.
STROKES = {
    "one": [[(0.5, 0.15), (0.5, 0.85)]],
    "zero": [[(0.5 + 0.22 * math.cos(k * math.pi / 10), 0.5 + 0.35 * math.sin(k * math.pi / 10)) for k in range(21)]],
    "seven": [[(0.3, 0.2), (0.7, 0.2), (0.45, 0.85)]],
    "two": [[(0.3, 0.3), (0.4, 0.18), (0.6, 0.18), (0.68, 0.32), (0.6, 0.5), (0.3, 0.82), (0.72, 0.82)]],
}


def model_answer(server: Server, pixels: np.ndarray) -> tuple[str, float]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    inp = httpclient.InferInput("IMAGE", [1, 8, 8], "UINT8")
    inp.set_data_from_numpy(pixels.reshape(1, 8, 8).astype(np.uint8))
    r = client.infer("digits_ensemble", [inp])
    return r.as_numpy("LABEL").reshape(-1)[0].decode(), float(r.as_numpy("SCORE").reshape(-1)[0])


def infer_requests(tab: Tab) -> list[Request]:
    sent: list[Request] = []
    tab.page.on("request", lambda r: sent.append(r) if r.url.endswith(INFER) else None)
    return sent


def shown(tab: Tab, count: int) -> tuple[str, float]:
    """The label and score once the page has shown its `count`-th prediction."""
    tab.until("(n) => window.__predictions >= n", arg=count)
    label = tab.page.locator("#digit-label").get_attribute("data-label") or ""
    score = float(tab.page.locator("#digit-score").inner_text().removeprefix("score "))
    return label, score


def count_predictions(tab: Tab) -> None:
    tab.page.evaluate("""() => {
      window.__predictions = 0;
      new MutationObserver(() => { window.__predictions++; })
        .observe(document.getElementById("digit-score"), { childList: true, characterData: true, subtree: true });
    }""")


def test_uploaded_digit_is_sent_as_sklearn_pixels_and_labelled_as_the_model_says(tab: Tab, ui_server: Server) -> None:
    digits = load_digits()
    sent = infer_requests(tab)
    tab.page.click("#tab-classic")
    count_predictions(tab)
    n = 0
    for index in (0, 7, 13):  # a 0, a 7 and a 3
        ink = sklearn_pixels(index)
        for grey in (255 - ink, ink):  # dark ink on white, then a light digit on black
            n += 1
            tab.page.set_input_files("#upload", files=[{"name": f"digit{index}.png", "mimeType": "image/png",
                                                        "buffer": png(grey, scale=8)}])
            label, score = shown(tab, n)
            body = sent[-1].post_data_json["inputs"][0]
            assert body["shape"] == [1, 8, 8] and body["datatype"] == "UINT8"
            assert body["data"] == ink.reshape(-1).tolist()
            expected, expected_score = model_answer(ui_server, ink)
            assert label == expected == NAMES[digits.target[index]]
            assert score == pytest.approx(expected_score, abs=1e-3)
    bars = tab.page.locator("#digit-bars li")
    assert bars.count() == 10


def draw(tab: Tab, strokes: list[list[tuple[float, float]]]) -> None:
    box = tab.page.locator("#pad").bounding_box()
    assert box
    mouse = tab.page.mouse
    for stroke in strokes:
        x, y = stroke[0]
        mouse.move(box["x"] + x * box["width"], box["y"] + y * box["height"])
        mouse.down()
        for x, y in stroke[1:]:
            mouse.move(box["x"] + x * box["width"], box["y"] + y * box["height"], steps=8)
        mouse.up()


def test_drawn_digits_follow_the_sklearn_convention(tab: Tab, ui_server: Server) -> None:
    sent = infer_requests(tab)
    tab.page.click("#tab-classic")
    count_predictions(tab)
    for n, (name, strokes) in enumerate(STROKES.items(), start=1):
        tab.page.click("#pad-clear")
        draw(tab, strokes)  # lifting the pen predicts
        label, _ = shown(tab, n)
        pixels = np.array(sent[-1].post_data_json["inputs"][0]["data"], dtype=np.uint8).reshape(8, 8)
        # Background is 0 and ink is high, as in the data set: the corners are empty, strokes saturate.
        assert pixels[[0, 0, 7, 7], [0, 7, 0, 7]].tolist() == [0, 0, 0, 0] and pixels.max() >= 128
        assert label == model_answer(ui_server, pixels)[0] == name
        probs = [float(t) for t in tab.page.locator("#digit-bars li .muted").all_inner_texts()]
        assert len(probs) == 10 and NAMES[int(np.argmax(probs))] == name
    tab.screenshot("classic.png")
