"""Digits preprocessing, written against Sluice's stacked-numpy API (SluiceModel)."""

import numpy as np


class SluiceModel:
    def execute_batch(self, inputs):
        images = inputs["IMAGE"]  # [N, 8, 8] uint8, 0..255
        pixels = images.reshape(images.shape[0], 64).astype(np.float32) / np.float32(255.0)
        return {"PIXELS": pixels}
