"""The OCR pipeline's own steps (model_repository/ocr_pipeline.py), without a server."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from model_repository import ocr_pipeline as ocr


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def test_ctc_merges_repeats_drops_blanks_and_scores_the_kept_steps() -> None:
    characters = ocr.rec_characters("a\nb")  # blank, a, b, space
    steps = [0, 1, 1, 0, 1, 2, 3, 3]  # blank a a blank a b space space -> "aab "
    probs = np.full((1, len(steps), 4), 0.01, dtype=np.float32)
    for t, cls in enumerate(steps):
        probs[0, t, cls] = 0.5 + t / 100
    (text, score), = ocr.ctc_decode(probs, characters)
    assert text == "aab "
    kept = [0.51, 0.54, 0.55, 0.56]  # the first of each run, blanks left out
    assert score == pytest.approx(float(np.mean(np.float32(kept).astype(np.float64))))
    assert ocr.ctc_decode(np.eye(4, dtype=np.float32)[[0, 0]][None], characters) == [("", 0.0)]


def test_rec_widths_are_the_widest_aspect_of_each_group_of_six_and_at_least_320() -> None:
    aspects = [2, 30, 3, 4, 5, 6, 7.5, 1]  # sorted: 1 2 3 4 5 6 | 7.5 30
    crops = [np.zeros((48, int(48 * a), 3), np.uint8) for a in aspects]
    widths = ocr.rec_widths(crops)
    assert widths[7] == widths[0] == widths[5] == 320  # the first group's widest is 6: under 320
    assert widths[1] == widths[6] == 48 * 30


def test_rec_input_keeps_the_aspect_and_pads_with_zeros() -> None:
    crop = np.full((24, 48, 3), 255, np.uint8)  # 2:1 -> 96 px wide at 48 high
    x = ocr.rec_input([crop], 320)
    assert x.shape == (1, 3, 48, 320) and x.dtype == np.float32
    assert np.all(x[0, :, :, :96] == 1.0) and np.all(x[0, :, :, 96:] == 0.0)


def test_an_image_with_alpha_is_laid_on_white_and_gray_becomes_three_channels() -> None:
    clear = Image.new("RGBA", (40, 40), (0, 0, 0, 0))
    assert np.all(ocr.decode(_png(clear)) == 255)
    gray = ocr.decode(_png(Image.new("L", (40, 40), 7)))
    assert gray.shape == (40, 40, 3) and np.all(gray == 7)


@pytest.mark.parametrize(("data", "why"), [
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "not an image"),
    (_png(Image.new("RGB", (1000, 1))), "too thin"),
    (b"x" * (ocr.MAX_IMAGE_BYTES + 1), "at most"),
], ids=["garbage", "sliver", "oversized"])
def test_unreadable_or_unbounded_images_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(ocr.ImageError, match=why):
        ocr.fit(ocr.decode(data))


def test_fit_pads_a_strip_and_boxes_map_back_to_the_clients_pixels() -> None:
    image = np.zeros((40, 800, 3), np.uint8)  # 20:1, so padded to 8:1 x 2 = 200 px high
    fitted, geometry = ocr.fit(image)
    assert fitted.shape[1] == 800 and geometry.pad_top == (200 - 40) // 2
    box = np.array([[[10, geometry.pad_top + 5], [100, geometry.pad_top + 5], [100, 900], [10, 900]]], np.float32)
    back = ocr.to_original(list(box), ocr.Geometry.from_array(geometry.as_array()))
    assert back[0].tolist() == [[10, 5], [100, 5], [100, 40], [10, 40]]  # clamped into the image


def test_a_big_image_is_scaled_to_2000_px_and_its_boxes_scaled_back() -> None:
    fitted, geometry = ocr.fit(np.zeros((1000, 4000, 3), np.uint8))
    assert fitted.shape[:2] == (512, 1984)  # 500 x 2000, each side rounded (half to even) to a multiple of 32
    back = ocr.to_original([np.array([[1984, 512]] * 4, np.float32)], geometry)
    assert back[0, 0].tolist() == [4000, 1000]
