"""The compute-bound vision example: a small residual CNN on scikit-learn's digits, upsampled to 32x32.

`build_cnn(out_dir)` trains it (a few epochs on 2 cores, seeded), exports it to ONNX (dynamic
batch dimension) and TorchScript, and writes `digits_cnn.json` beside them: held-out accuracy,
parameters, MFLOPs per image, training time. `classic_build.build_all` calls it once per
CNN_VERSION and links the files into the repository (`digits_cnn`, `digits_cnn_pt`).

Input `image` FP32 [N, 1, 32, 32] (pixels in [0, 1], `digits_32()` makes them) ->
`logits` FP32 [N, 10]. torch is imported only here, inside the build.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

CNN_VERSION = "cnn-v1"  # the cache key: bump when the data, the network or the training changes
WIDTH = 24  # channels of the first stage; the stages are WIDTH, 2*WIDTH, 4*WIDTH
EPOCHS = 8
_SEED = 0


def upsample_matrix(n_in: int = 8, n_out: int = 32) -> np.ndarray:
    """Bilinear interpolation (half-pixel centres, edges clamped) as an [n_out, n_in] matrix."""
    a = np.zeros((n_out, n_in))
    for i in range(n_out):
        x = min(max((i + 0.5) * n_in / n_out - 0.5, 0.0), n_in - 1.0)
        lo = int(np.floor(x))
        hi = min(lo + 1, n_in - 1)
        a[i, lo] += 1.0 - (x - lo)
        a[i, hi] += x - lo
    return a


def digits_32() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as FP32 [N, 1, 32, 32] images in [0, 1], and their labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    a = upsample_matrix()
    images = np.einsum("ij,njk,lk->nil", a, digits.images / 16.0, a).astype(np.float32)
    return images[:, None], digits.target


def split(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed 80/20 train/test split of the build (seeded)."""
    idx = np.random.default_rng(_SEED).permutation(n)
    cut = int(0.8 * n)
    return idx[:cut], idx[cut:]


def _network(width: int) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        """A ResNet basic block: two 3x3 convolutions with batch norm, and a (projected) shortcut."""

        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.short = (nn.Identity() if stride == 1 and cin == cout else
                          nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
            return torch.relu(out + self.short(x))

    class DigitsCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
            self.blocks = nn.Sequential(Block(width, width, 1), Block(width, 2 * width, 2),
                                        Block(2 * width, 4 * width, 2))
            self.head = nn.Linear(4 * width, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.blocks(self.stem(x)).mean((2, 3)))

    return DigitsCNN()


def _train(net: Any, x: np.ndarray, y: np.ndarray) -> None:
    import torch
    import torch.nn.functional as F

    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.AdamW(net.parameters(), 3e-3, weight_decay=1e-4)
    steps_per_epoch = (len(xt) + 63) // 64
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 3e-3, total_steps=EPOCHS * steps_per_epoch)
    gen = torch.Generator().manual_seed(_SEED)
    net.train()
    for _ in range(EPOCHS):
        perm = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), 64):
            batch = perm[i:i + 64]
            shift = torch.randint(-2, 3, (2,), generator=gen).tolist()  # small translations
            xb = torch.roll(xt[batch], shift, (2, 3))
            loss = F.cross_entropy(net(xb), yt[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    net.eval()


def count_macs(net: Any, shape: tuple[int, ...] = (1, 1, 32, 32)) -> int:
    """Multiply-accumulates of one image through the convolutions and the linear head."""
    import torch
    from torch import nn

    total = 0

    def hook(module: Any, inputs: Any, output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Conv2d):
            k = module.kernel_size[0] * module.kernel_size[1] * module.in_channels // module.groups
            total += output.numel() * k
        else:
            total += module.in_features * module.out_features

    handles = [m.register_forward_hook(hook) for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        net(torch.zeros(shape))
    for h in handles:
        h.remove()
    return total


def build_cnn(out_dir: Path) -> dict[str, Any]:
    """Train and export into `out_dir`: digits_cnn.onnx, digits_cnn.pt, digits_cnn.json (returned)."""
    import torch

    t0 = time.monotonic()
    torch.manual_seed(_SEED)
    torch.set_num_threads(2)
    images, labels = digits_32()
    train, test = split(len(images))
    net = _network(WIDTH)
    _train(net, images[train], labels[train])
    train_s = time.monotonic() - t0
    with torch.no_grad():
        predicted = net(torch.from_numpy(images[test])).argmax(1).numpy()
    accuracy = float((predicted == labels[test]).mean())
    example = torch.zeros(1, 1, 32, 32)
    onnx_tmp, pt_tmp = out_dir / "digits_cnn.onnx.tmp", out_dir / "digits_cnn.pt.tmp"
    torch.onnx.export(net, (example,), str(onnx_tmp), input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17, dynamo=False)
    with torch.no_grad():
        torch.jit.trace(net, example).save(str(pt_tmp))  # type: ignore[no-untyped-call]
    report = {"model": "digits_cnn", "version": CNN_VERSION, "architecture": _describe(),
              "parameters": sum(p.numel() for p in net.parameters()),
              "mflops_per_image": round(2 * count_macs(net) / 1e6, 1),
              "test_accuracy": round(accuracy, 4), "test_images": len(test), "train_images": len(train),
              "epochs": EPOCHS, "train_s": round(train_s, 1), "build_s": round(time.monotonic() - t0, 1)}
    onnx_tmp.replace(out_dir / "digits_cnn.onnx")
    pt_tmp.replace(out_dir / "digits_cnn.pt")
    (out_dir / "digits_cnn.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _describe() -> str:
    w = WIDTH
    return (f"conv3x3({w})+BN+ReLU @32x32; residual block {w} @32x32; residual block {2 * w}, stride 2 @16x16; "
            f"residual block {4 * w}, stride 2 @8x8; global average pool; linear {4 * w}->10")
