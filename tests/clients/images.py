"""Pictures of scikit-learn digits, as a person would upload them."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits


def sklearn_pixels(index: int) -> np.ndarray:
    """Digit `index` of the data set as the ensemble's IMAGE: UINT8 [8, 8], 0..255, ink high."""
    return np.rint(load_digits().images[index] * 255 / 16).astype(np.uint8)


def png(grey: np.ndarray, scale: int = 8) -> bytes:
    """A greyscale PNG of `grey`, each pixel a `scale`×`scale` square."""
    buf = io.BytesIO()
    Image.fromarray(np.kron(grey, np.ones((scale, scale), dtype=np.uint8)), mode="L").save(buf, "PNG")
    return buf.getvalue()
