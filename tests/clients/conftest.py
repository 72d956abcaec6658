"""One gateway for the client tests (the browser page, the openai npm package, examples/):
the default LLM on the in-process engine plus the digits ensemble, the OCR pipeline and their
steps, HTTP and gRPC. And one headless Chromium for every page test."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser

from tests.clients.browser import DESKTOP, Tab, chromium
from tests.integration.ocr_support import ocr_repository
from tests.servers import DEFAULT_REPO, Server, llm_only_repository, start_server

DIGITS_MODELS = ("digits_ensemble", "digits_preprocess", "digits_onnx", "digits_postprocess")


@pytest.fixture(scope="package")  # stopped once tests/clients is done: the rest of the suite needs the cores
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("clients")
    repo = llm_only_repository(tmp)
    for name in DIGITS_MODELS:
        shutil.copytree(DEFAULT_REPO / name, repo / name)
    ocr_repository(repo)
    server = start_server(["--model-repository", str(repo)], tmp / "server.log", grpc=True)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Per module: see `chromium` for why not per session."""
    with chromium() as b:
        yield b


@pytest.fixture()
def tab(browser: Browser, ui_server: Server) -> Iterator[Tab]:
    """The page at desktop size, loaded from the gateway."""
    t = Tab(browser, ui_server.url + "/", **DESKTOP)
    yield t
    t.close()
