"""The steps of the OCR pipeline around its three networks, as plain functions over numpy arrays.

The networks are PaddleOCR's PP-OCRv4 text detector (DBNet), its mobile direction classifier and its
PP-OCRv4 recogniser (CRNN with CTC), as the `rapidocr-onnxruntime` wheel ships them (classic_build
copies them into `ocr_det`, `ocr_cls` and `ocr_rec`). The steps follow that package's defaults, so
that the served pipeline answers what `rapidocr_onnxruntime.RapidOCR` answers on the same image:

- `decode`: image bytes to a BGR uint8 array (PIL, as RapidOCR loads bytes);
- `fit`: sides limited to 2000 px and at least 30 px (multiples of 32), and a strip wider than 8:1
  or lower than 30 px padded above and below (`Geometry` keeps what maps boxes back);
- `det_input`: the detector's input, the shorter side scaled up to 736 px (multiple of 32), (x/255
  - 0.5) / 0.5;
- `boxes`: DBNet's probability map to quadrilaterals (threshold 0.3, dilation, box score >= 0.5,
  unclip ratio 1.6), ordered clockwise from the top-left, read top to bottom, left to right;
- `crop`: a box's perspective crop (a tall one turned on its side);
- `cls_input` / `upright`: the classifier's 48x192 input, and a crop turned over when it reads 180
  degrees with a score above 0.9;
- `rec_widths` / `rec_input` / `ctc_decode`: the recogniser's 48-px-high input, padded to the width
  RapidOCR would give the crop (widths in its groups of six, sorted by aspect, at least 320 px), and
  greedy CTC decoding; lines scoring under 0.5 are dropped (`TEXT_SCORE`).

The pipeline differs from RapidOCR's only where RapidOCR is wrong: resize ratios compose when an image
is both shrunk and grown (RapidOCR keeps the last), an image with alpha is laid on white, and a
photo's EXIF orientation is applied (as browsers show it; RapidOCR reads the raw pixels).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import cv2
import numpy as np
import pyclipper
from PIL import Image, ImageOps
from shapely.geometry import Polygon

MAX_SIDE, MIN_SIDE = 2000, 30
MIN_HEIGHT, MAX_ASPECT = 30, 8
DET_SIDE = 736
DET_THRESH, BOX_THRESH, UNCLIP_RATIO, MAX_CANDIDATES, MIN_BOX = 0.3, 0.5, 1.6, 1000, 3
CLS_SHAPE = (3, 48, 192)
CLS_THRESH = 0.9
REC_HEIGHT, REC_MIN_WIDTH, REC_GROUP = 48, 320, 6
TEXT_SCORE = 0.5
MAX_IMAGE_BYTES = 16 << 20
MAX_PIXELS = 40_000_000
FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")  # what PIL may try (not every format it knows)


class ImageError(ValueError):
    """The image cannot be read or is out of bounds (the client's fault: a 400)."""


@dataclass(frozen=True)
class Geometry:
    """How the fitted image maps back to the client's: scale per axis, padding on top, original size."""

    ratio_h: float
    ratio_w: float
    pad_top: int
    height: int
    width: int

    def as_array(self) -> np.ndarray:
        return np.array([self.ratio_h, self.ratio_w, self.pad_top, self.height, self.width], np.float64)

    @classmethod
    def from_array(cls, values: np.ndarray) -> Geometry:
        ratio_h, ratio_w, pad_top, height, width = (float(v) for v in np.asarray(values).reshape(-1)[:5])
        return cls(ratio_h, ratio_w, int(pad_top), int(height), int(width))


def decode(data: bytes) -> np.ndarray:
    """Encoded image bytes (PNG, JPEG, WebP, BMP...) to a BGR uint8 array."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"the image is {len(data)} bytes; at most {MAX_IMAGE_BYTES} are read")
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
        if image.width * image.height > MAX_PIXELS:
            raise ImageError(f"the image is {image.width}x{image.height} px; at most {MAX_PIXELS} px are read")
        image.load()
        image = ImageOps.exif_transpose(image)  # a phone's photo, upright as a browser shows it
    except ImageError:
        raise
    except Exception as exc:  # PIL raises many kinds for a bad file
        raise ImageError(f"the bytes are not an image PIL can read ({type(exc).__name__})") from None
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
    elif image.mode == "1":
        image = image.convert("L")
    elif image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    pixels = np.asarray(image)
    if pixels.ndim == 2:
        return cv2.cvtColor(pixels, cv2.COLOR_GRAY2BGR)
    return cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)


def _resize_to(image: np.ndarray, ratio: float) -> np.ndarray:
    """`image` scaled by `ratio`, each side rounded to a multiple of 32."""
    h, w = image.shape[:2]
    height, width = round(int(h * ratio) / 32) * 32, round(int(w * ratio) / 32) * 32
    if height <= 0 or width <= 0:
        raise ImageError(f"a {w}x{h} px image is too thin to read")
    return cv2.resize(image, (width, height))


def fit(image: np.ndarray) -> tuple[np.ndarray, Geometry]:
    """The image the detector and the crops work on, and how it maps back to `image`."""
    raw_h, raw_w = image.shape[:2]
    if max(raw_h, raw_w) > MAX_SIDE:
        image = _resize_to(image, MAX_SIDE / max(raw_h, raw_w))
    if min(image.shape[:2]) < MIN_SIDE:
        image = _resize_to(image, MIN_SIDE / min(image.shape[:2]))
    h, w = image.shape[:2]
    if max(h, w) > MAX_SIDE:  # grown past the bound: a sliver (RapidOCR would allocate gigabytes)
        raise ImageError(f"a {raw_w}x{raw_h} px image is too thin to read: at most {MAX_SIDE // MIN_SIDE}:1")
    pad_top = 0
    if h <= MIN_HEIGHT or w / h > MAX_ASPECT:
        pad_top = abs(max(int(w / MAX_ASPECT), MIN_HEIGHT) * 2 - h) // 2
        image = cv2.copyMakeBorder(image, pad_top, pad_top, 0, 0, cv2.BORDER_CONSTANT, value=(0, 0, 0))
    return image, Geometry(raw_h / h, raw_w / w, pad_top, raw_h, raw_w)


def det_input(image: np.ndarray) -> np.ndarray:
    """The detector's [1, 3, H, W] float32 input for a fitted image."""
    h, w = image.shape[:2]
    ratio = DET_SIDE / min(h, w) if min(h, w) < DET_SIDE else 1.0
    resized = _resize_to(image, ratio)
    # float32 scaled, then float64 centred: the order (and so the rounding) RapidOCR uses.
    normalised = (resized.astype(np.float32) * (1 / 255.0) - np.array([0.5] * 3)) / np.array([0.5] * 3)
    return np.expand_dims(normalised.transpose((2, 0, 1)), 0).astype(np.float32)


def _mini_box(contour: np.ndarray) -> tuple[np.ndarray, float]:
    """The contour's minimum-area rectangle, corners from the top-left clockwise, and its short side."""
    rect = cv2.minAreaRect(contour)
    points = sorted(cv2.boxPoints(rect), key=lambda p: p[0])
    left = (points[0], points[1]) if points[1][1] > points[0][1] else (points[1], points[0])
    right = (points[2], points[3]) if points[3][1] > points[2][1] else (points[3], points[2])
    return np.array([left[0], right[0], right[1], left[1]]), min(rect[1])


def _box_score(prob: np.ndarray, box: np.ndarray) -> float:
    """The mean probability inside `box` (the fast score: the polygon's pixels on the map)."""
    h, w = prob.shape[:2]
    xmin, xmax = (int(np.clip(f(box[:, 0]), 0, w - 1)) for f in (lambda v: np.floor(v.min()),
                                                                  lambda v: np.ceil(v.max())))
    ymin, ymax = (int(np.clip(f(box[:, 1]), 0, h - 1)) for f in (lambda v: np.floor(v.min()),
                                                                  lambda v: np.ceil(v.max())))
    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), dtype=np.uint8)
    shifted = box - np.array([xmin, ymin], dtype=box.dtype)
    cv2.fillPoly(mask, shifted.reshape(1, -1, 2).astype(np.int32), 1)
    return float(cv2.mean(prob[ymin:ymax + 1, xmin:xmax + 1], mask)[0])


def _unclip(box: np.ndarray) -> np.ndarray:
    """The box grown by area * ratio / perimeter (the DB paper's offset), as a contour."""
    polygon = Polygon(box)
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(box, pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    return np.array(offset.Execute(polygon.area * UNCLIP_RATIO / polygon.length)).reshape((-1, 1, 2))


def _candidates(prob: np.ndarray, height: int, width: int) -> list[np.ndarray]:
    """Boxes on the map's text regions, scaled to a `height` x `width` image."""
    mask = cv2.dilate((prob > DET_THRESH).astype(np.uint8), np.ones((2, 2)))
    contours = cv2.findContours(mask * 255, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)[-2]
    map_h, map_w = mask.shape
    found = []
    for contour in contours[:MAX_CANDIDATES]:
        points, side = _mini_box(contour)
        if side < MIN_BOX or _box_score(prob, points.reshape(-1, 2)) < BOX_THRESH:
            continue
        box, side = _mini_box(_unclip(points))
        if side < MIN_BOX + 2:
            continue
        box[:, 0] = np.clip(np.round(box[:, 0] / map_w * width), 0, width)
        box[:, 1] = np.clip(np.round(box[:, 1] / map_h * height), 0, height)
        found.append(box.astype(np.int32))
    return found


def _clockwise(box: np.ndarray, height: int, width: int) -> np.ndarray:
    """Corners as top-left, top-right, bottom-right, bottom-left, clipped into the image (float32)."""
    by_x = box[np.argsort(box[:, 0]), :]
    left, right = by_x[:2], by_x[2:]
    top_left, bottom_left = left[np.argsort(left[:, 1]), :]
    top_right, bottom_right = right[np.argsort(right[:, 1]), :]
    rect = np.array([top_left, top_right, bottom_right, bottom_left], dtype=np.float32)
    rect[:, 0] = np.clip(rect[:, 0], 0, width - 1).astype(np.int32)
    rect[:, 1] = np.clip(rect[:, 1], 0, height - 1).astype(np.int32)
    return rect


def _reading_order(boxes: list[np.ndarray]) -> list[np.ndarray]:
    """Top to bottom; boxes whose tops are within 10 px of each other, left to right."""
    ordered = sorted(boxes, key=lambda b: (b[0][1], b[0][0]))
    for i in range(len(ordered) - 1):
        for j in range(i, -1, -1):
            if abs(ordered[j + 1][0][1] - ordered[j][0][1]) < 10 and ordered[j + 1][0][0] < ordered[j][0][0]:
                ordered[j], ordered[j + 1] = ordered[j + 1], ordered[j]
            else:
                break
    return ordered


def boxes(det_output: np.ndarray, height: int, width: int) -> list[np.ndarray]:
    """DBNet's [1, 1, H, W] map to the text boxes of a fitted `height` x `width` image, in reading order."""
    kept = []
    for box in _candidates(det_output[0, 0], height, width):
        rect = _clockwise(box, height, width)
        if int(np.linalg.norm(rect[0] - rect[1])) > 3 and int(np.linalg.norm(rect[0] - rect[3])) > 3:
            kept.append(rect)
    return _reading_order(kept)


def crop(image: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The box's content, straightened; a crop 1.5 times taller than wide is turned on its side."""
    width = int(max(np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[2] - box[3])))
    height = int(max(np.linalg.norm(box[0] - box[3]), np.linalg.norm(box[1] - box[2])))
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], dtype=np.float32)
    matrix = cv2.getPerspectiveTransform(box, target)
    out = cv2.warpPerspective(image, matrix, (width, height), borderMode=cv2.BORDER_REPLICATE,
                              flags=cv2.INTER_CUBIC)
    return np.rot90(out) if out.shape[0] / out.shape[1] >= 1.5 else out


def _padded(image: np.ndarray, width: int) -> np.ndarray:
    """`image` resized to 48 px high (at most `width` wide), scaled to [-1, 1], zero-padded to `width`."""
    h, w = image.shape[:2]
    resized_w = min(width, math.ceil(REC_HEIGHT * (w / float(h))))
    resized = cv2.resize(image, (resized_w, REC_HEIGHT)).astype(np.float32).transpose((2, 0, 1)) / 255
    resized -= 0.5
    resized /= 0.5
    out = np.zeros((3, REC_HEIGHT, width), dtype=np.float32)
    out[:, :, :resized_w] = resized
    return out


def cls_input(crops: list[np.ndarray]) -> np.ndarray:
    """The direction classifier's [n, 3, 48, 192] input."""
    return np.stack([_padded(c, CLS_SHAPE[2]) for c in crops]).astype(np.float32)


def upright(crops: list[np.ndarray], probs: np.ndarray) -> list[np.ndarray]:
    """Crops the classifier reads as upside down (label 180 above CLS_THRESH) turned over."""
    return [cv2.rotate(c, cv2.ROTATE_180) if p.argmax() == 1 and p[1] > CLS_THRESH else c
            for c, p in zip(crops, probs, strict=True)]


def rec_widths(crops: list[np.ndarray]) -> list[int]:
    """Each crop's padded input width: RapidOCR's, the widest aspect in its group of six (crops sorted
    by aspect), at least 320 px. It depends on the request alone, so a batch of crops from many
    requests reads each crop as RapidOCR does."""
    aspects = np.array([c.shape[1] / float(c.shape[0]) for c in crops])
    order = np.argsort(aspects)
    widths = [0] * len(crops)
    for start in range(0, len(crops), REC_GROUP):
        group = order[start:start + REC_GROUP]
        widest = max(REC_MIN_WIDTH / REC_HEIGHT, *(aspects[i] for i in group))
        for i in group:
            widths[i] = int(REC_HEIGHT * widest)
    return widths


def rec_input(crops: list[np.ndarray], width: int) -> np.ndarray:
    """The recogniser's [n, 3, 48, width] input."""
    return np.stack([_padded(c, width) for c in crops]).astype(np.float32)


def ctc_decode(probs: np.ndarray, characters: list[str]) -> list[tuple[str, float]]:
    """Greedy CTC over [n, T, classes]: repeats merged, blanks (class 0) dropped; a line's score is
    the mean probability of its kept steps (0 when none)."""
    best, best_prob = probs.argmax(axis=2), probs.max(axis=2)
    lines = []
    for ids, step_probs in zip(best, best_prob, strict=True):
        keep = np.ones(len(ids), dtype=bool)
        keep[1:] = ids[1:] != ids[:-1]
        keep &= ids != 0
        kept = step_probs[keep]
        score = float(np.mean(kept.astype(np.float64))) if kept.size else 0.0  # a float64 mean, as RapidOCR's
        lines.append(("".join(characters[i] for i in ids[keep]), score))
    return lines


def rec_characters(metadata_text: str) -> list[str]:
    """The recogniser's classes from its ONNX metadata's `character` list: blank first, space last."""
    return ["blank", *metadata_text.splitlines(), " "]


def to_original(found: list[np.ndarray], geometry: Geometry) -> np.ndarray:
    """Boxes on the fitted image mapped back onto the client's image, [n, 4, 2] float32."""
    out = np.array(found, dtype=np.float32).reshape(-1, 4, 2)
    out[:, :, 1] -= geometry.pad_top
    out[:, :, 0] *= geometry.ratio_w
    out[:, :, 1] *= geometry.ratio_h
    out = np.maximum(out, 0)
    out[:, :, 0] = np.minimum(out[:, :, 0], geometry.width)
    out[:, :, 1] = np.minimum(out[:, :, 1], geometry.height)
    return out
