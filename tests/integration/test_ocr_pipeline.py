"""The OCR pipeline of the default repository (`ocr`: preprocess -> DBNet -> postprocess with BLS
calls to the direction classifier and the recogniser), served by a real `sluice serve` and read with
tritonclient over HTTP (binary tensors) and gRPC.

- Text drawn on noise is read back with a character error rate under 5 %, and every answer (boxes,
  text, scores) equals, exactly, what rapidocr_onnxruntime's own pipeline reads from the same image.
- Single-line images sent together meet in the recogniser's batches (its statistics show executions
  of more than one crop, so crops of different requests), and each answer equals, bit for bit, the
  answer to the same image sent alone.
- A page of more lines than the recogniser's batch holds is read whole (its crops go in several calls).
- A bad image is the client's error, in KServe's format: a 400 over HTTP, INVALID_ARGUMENT over gRPC.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.ocr_support import PAGES, Page, cer, ocr_repository, one_line_pages
from tests.servers import Server, start_server

pytestmark = pytest.mark.integration

REC_WINDOW_US = 1_500_000  # long enough that concurrent requests' crops always meet


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("ocr")
    repo = ocr_repository(tmp / "repo", rec_window_us=REC_WINDOW_US)
    started = start_server(["--model-repository", str(repo)], tmp / "server.log", grpc=True)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def references() -> list[list[tuple[list[list[float]], str, float]]]:
    """rapidocr_onnxruntime's own answer to each of PAGES (its pipeline, in this process)."""
    from rapidocr_onnxruntime import RapidOCR

    engine = RapidOCR()
    return [[(box, text, score) for box, text, score in (engine(page.png())[0] or [])] for page in PAGES]


def _read(client: Any, module: Any, image: bytes) -> list[tuple[list[list[float]], str, float]]:
    """The `ocr` ensemble's answer to one image, as RapidOCR gives its own: (box, text, score) per line."""
    tensor = module.InferInput("IMAGE", [1], "BYTES")
    data = np.array([image], dtype=np.object_)
    if module is httpclient:
        tensor.set_data_from_numpy(data, binary_data=True)
    else:
        tensor.set_data_from_numpy(data)
    result = client.infer("ocr", [tensor])
    boxes, texts, scores = (result.as_numpy(name) for name in ("BOXES", "TEXTS", "SCORES"))
    assert boxes.dtype == np.float32 and boxes.shape == (len(texts), 4, 2)
    return [(b.tolist(), t.decode(), float(s)) for b, t, s in zip(boxes, texts, scores, strict=True)]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_rendered_text_is_read_as_rapidocr_reads_it(server: Server, references: list[Any], protocol: str) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = (httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=300)
              if protocol == "http" else grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}"))
    for page, reference in zip(PAGES, references, strict=True):
        answer = _read(client, module, page.png())
        read = " ".join(text for _, text, _ in answer)
        assert cer(page.truth, read) < 0.05, f"read {read!r} for {page.truth!r}"
        assert answer == reference, f"differs from RapidOCR on {page.truth!r}"


def test_a_page_of_more_lines_than_a_batch_holds_is_read_whole(server: Server) -> None:
    """40 lines: more crops than ocr_cls's and ocr_rec's max_batch_size (32), so several BLS calls."""
    page = Page(tuple(f"line {i} of the page" for i in range(1, 41)), (736, 1250), font_px=18, seed=5)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=300)
    answer = _read(client, httpclient, page.png())
    read = " ".join(text.strip() for _, text, _ in answer)  # small print: the recogniser adds a leading space
    assert len(answer) == 40 and cer(page.truth, read) < 0.05, read


def _rec_batches(server: Server) -> dict[int, int]:
    """ocr_rec's executions so far, by batch size."""
    stats = httpx.get(f"{server.url}/v2/models/ocr_rec/stats", timeout=30).json()["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats.get("batch_stats", [])}


def test_concurrent_crops_share_recogniser_batches_and_answer_as_alone(server: Server) -> None:
    pages = one_line_pages(4)
    url = f"127.0.0.1:{server.http_port}"
    before = _rec_batches(server)

    def read(page: Page) -> list[tuple[list[list[float]], str, float]]:
        return _read(httpclient.InferenceServerClient(url, network_timeout=300), httpclient, page.png())

    with ThreadPoolExecutor(len(pages)) as pool:
        together = list(pool.map(read, pages))
    after = _rec_batches(server)
    grown = {size: after.get(size, 0) - before.get(size, 0) for size in after}
    assert any(size > 1 and count > 0 for size, count in grown.items()), f"no shared batch: {grown}"
    for page, answer in zip(pages, together, strict=True):
        assert len(answer) == 1 and cer(page.truth, answer[0][1]) < 0.05, answer
        assert read(page) == answer, f"{page.truth!r} read alone differs from the batched answer"


@pytest.mark.parametrize(("image", "why"), [
    (b"not an image at all", "not an image"),
    (Page(("x",), (1000, 1)).png(), "too thin"),
])
def test_a_bad_image_is_the_clients_error(server: Server, image: bytes, why: str) -> None:
    http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    for module, client in ((httpclient, http), (grpcclient, grpc)):
        tensor = module.InferInput("IMAGE", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([image], dtype=np.object_))
        with pytest.raises(InferenceServerException) as raised:
            client.infer("ocr", [tensor])
        status = str(raised.value.status())
        assert status in ("400", "StatusCode.INVALID_ARGUMENT"), (status, raised.value.message())
        assert why in raised.value.message()


def test_two_images_in_one_request_are_refused(server: Server) -> None:
    body = {"inputs": [{"name": "IMAGE", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]}
    answer = httpx.post(f"{server.url}/v2/models/ocr/infer", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert "error" in answer.json()
