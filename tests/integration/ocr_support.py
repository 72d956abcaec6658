"""Images with known text for the OCR pipeline: lines drawn with Pillow's own font on noise, and the
character error rate of a reading. Shared by tests/integration/test_ocr_pipeline.py and the OCR
benchmarks."""

from __future__ import annotations

import io
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

ROOT = Path(__file__).resolve().parents[2]
OCR_MODELS = ("ocr", "ocr_preprocess", "ocr_det", "ocr_postprocess", "ocr_cls", "ocr_rec")


@dataclass(frozen=True)
class Page:
    """An image's text, line by line in reading order, and how it is drawn."""

    lines: tuple[str, ...]
    size: tuple[int, int]  # width, height
    font_px: int = 34
    upside_down: bool = False
    seed: int = 0

    @property
    def truth(self) -> str:
        return " ".join(reversed(self.lines) if self.upside_down else self.lines)

    def png(self) -> bytes:
        rng = np.random.default_rng(self.seed)
        noise = rng.integers(150, 256, size=(self.size[1], self.size[0], 3), dtype=np.uint8)
        image = Image.fromarray(noise)
        draw = ImageDraw.Draw(image)
        font = ImageFont.load_default(size=self.font_px)
        y = max(4, self.font_px // 3)
        for line in self.lines:
            draw.text((16, y), line, fill=(20, 20, 20), font=font)
            y += int(self.font_px * 1.7)
        if self.upside_down:
            image = image.rotate(180)
        out = io.BytesIO()
        image.save(out, "PNG")
        return out.getvalue()


# Short sides of 736 px, the detector's own scale (a smaller image is scaled up to it).
PAGES = (
    Page(("HELLO WORLD", "Sluice 2026", "invoice 4711", "total 12.50 EUR", "The quick brown fox",
          "jumps over the lazy dog"), (736, 736), seed=1),
    Page(("upside down", "text is read", "the right way up"), (736, 736), font_px=40, upside_down=True, seed=2),
    # The first line is wider than 6.7:1, so its crop is padded past the 320-px bucket.
    Page(("Triton-compatible serving with dynamic batching over KServe v2", "gRPC and HTTP", "ensembles"),
         (1472, 736), seed=3),
)


def one_line_pages(count: int) -> list[Page]:
    """`count` images of one short line each (one crop each, of the 320-px bucket)."""
    words = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")
    return [Page((f"{words[i % len(words)]} {100 + i}",), (736, 736), seed=10 + i) for i in range(count)]


def cer(truth: str, read: str) -> float:
    """Character error rate: the edit distance from `truth` to `read`, over len(truth)."""
    previous = list(range(len(read) + 1))
    for i, a in enumerate(truth, 1):
        current = [i]
        for j, b in enumerate(read, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a != b)))
        previous = current
    return previous[-1] / len(truth)


def ocr_repository(dest: Path, *, rec_window_us: int | None = None) -> Path:
    """A repository of the OCR pipeline's models alone (networks copied from the rapidocr wheel); with
    `rec_window_us`, ocr_rec waits that long for a batch of 2 or more (so a test sees batches form)."""
    from model_repository.classic_build import install_ocr

    for name in OCR_MODELS:
        shutil.copytree(ROOT / "model_repository" / name, dest / name,
                        ignore=shutil.ignore_patterns("*.onnx", "__pycache__"))
    install_ocr(dest)
    if rec_window_us is not None:
        config = dest / "ocr_rec" / "config.pbtxt"
        text = config.read_text().replace("dynamic_batching { max_queue_delay_microseconds: 4000 }", "")
        config.write_text(text + f"dynamic_batching {{ max_queue_delay_microseconds: {rec_window_us} "
                                 "preferred_batch_size: [ 2 ] }\n")
    return dest
