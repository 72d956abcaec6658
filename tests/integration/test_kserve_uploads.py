"""The repository API on a real `sluice serve --allow-model-uploads` (real tritonclient, HTTP and gRPC):
uploads are written inside their model only, as one change, after the config is validated; a model's files
(including `default_model_filename`) stay inside its directory. The shared server, without the flag, refuses
uploads (tests/integration/test_kserve_http.py)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.kserve_support import start_server, write_model

pytestmark = pytest.mark.integration

DOUBLE_PY = "class SluiceModel:\n    def execute_batch(self, inputs):\n        return {'Y': inputs['X'] * 2}\n"
PLUS_ONE_PY = DOUBLE_PY.replace("* 2", "+ 1")
CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 2 ] }} ]
{extra}
'''


@pytest.fixture(scope="module")
def server():
    root = Path(tempfile.mkdtemp(prefix="sluice-uploads-"))
    repo = root / "repo"
    write_model(repo, "double", CONFIG.format(name="double", extra=""), DOUBLE_PY)
    secret = root / "outside.py"
    secret.write_text(DOUBLE_PY)
    escaping = write_model(repo, "escaping_link", CONFIG.format(name="escaping_link", extra=""), DOUBLE_PY)
    (escaping / "1" / "model.py").unlink()
    os.symlink(secret, escaping / "1" / "model.py")
    write_model(repo, "escaping_name", CONFIG.format(name="escaping_name",
                                                     extra='default_model_filename: "../../../outside.py"'),
                DOUBLE_PY)
    srv = start_server(root, repo, "--allow-model-uploads")
    yield srv
    srv.stop()


@pytest.fixture()
def http(server):
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def _config(client, name: str = "double") -> dict:
    return client.get_model_config(name)


def _y(client, model: str = "double") -> list:
    inp = httpclient.InferInput("X", [1, 2], "INT32")
    inp.set_data_from_numpy(np.array([[1, 2]], dtype=np.int32))
    return client.infer(model, [inp]).as_numpy("Y").tolist()


def _files(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its content (None for a directory)."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*")) if "__pycache__" not in p.parts}


def test_escaping_model_files_on_disk_are_refused_at_load(http):
    index = {m["name"]: m for m in http.get_model_repository_index()}
    for name in ("escaping_link", "escaping_name"):
        assert index[name]["state"] == "UNAVAILABLE" and "default" in index[name]["reason"], index[name]
    assert "resolves outside the model directory" in index["escaping_link"]["reason"]
    assert "must be a file name inside the version directory" in index["escaping_name"]["reason"]
    assert _y(http) == [[2, 4]]


def test_upload_accepted_with_the_flag(server, http):
    config = _config(http)
    http.load_model("double", config=json.dumps(config), files={"file:2/model.py": PLUS_ONE_PY.encode()})
    assert (server.repo / "double" / "2" / "model.py").read_text() == PLUS_ONE_PY
    assert _y(http) == [[2, 3]]  # version 2 is the latest
    assert not [p for p in server.repo.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("path", ["../evil.py", "/tmp/evil.py", "2/../../evil.py", "x\\..\\evil.py", ""])
def test_upload_paths_outside_the_model_are_refused(server, http, path):
    before = _files(server.repo)
    with pytest.raises(InferenceServerException) as err:
        http.load_model("double", config=json.dumps(_config(http)), files={f"file:{path}": b"print('pwned')"})
    assert err.value.status() == "400" and "inside the model directory" in err.value.message()
    assert _files(server.repo) == before and not (server.repo / "evil.py").exists()


@pytest.mark.parametrize("filename", ["../../../outside.py", "OUTSIDE"])
def test_override_with_an_escaping_default_model_filename_is_refused(server, http, filename):
    if filename == "OUTSIDE":
        filename = str(server.root / "outside.py")  # an absolute path to a file that exists
    before = _files(server.repo)
    config = dict(_config(http), default_model_filename=filename)
    with pytest.raises(InferenceServerException) as err:
        http.load_model("double", config=json.dumps(config))
    assert err.value.status() == "400" and "default_model_filename" in err.value.message()
    with pytest.raises(InferenceServerException) as err:  # and with files: nothing is written either
        http.load_model("double", config=json.dumps(config), files={"file:5/model.py": DOUBLE_PY.encode()})
    assert err.value.status() == "400"
    assert _files(server.repo) == before
    assert http.is_model_ready("double")


def test_invalid_override_config_writes_nothing(server, http):
    before = _files(server.repo)
    bad = dict(_config(http))
    bad["input"] = [dict(bad["input"][0], dims=[0])]
    for config in (json.dumps(bad), "{not json"):
        with pytest.raises(InferenceServerException) as err:
            http.load_model("double", config=config, files={"file:6/model.py": DOUBLE_PY.encode()})
        assert err.value.status() == "400"
    assert _files(server.repo) == before


def test_failed_upload_is_rolled_back_and_the_model_keeps_serving(server, http):
    served = _y(http)
    before = _files(server.repo)
    broken = b"import no_such_module_anywhere\n"
    with pytest.raises(InferenceServerException) as err:
        http.load_model("double", config=json.dumps(_config(http)),
                        files={"file:7/model.py": broken, "file:1/model.py": broken, "file:7/extra.txt": b"data"})
    assert err.value.status() == "400" and "no_such_module_anywhere" in err.value.message()
    assert _files(server.repo) == before  # neither file stayed
    assert http.is_model_ready("double") and _y(http) == served


def test_upload_over_grpc(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        config = client.get_model_config("double", as_json=True)["config"]
        client.load_model("double", config=json.dumps(config), files={"file:4/model.py": DOUBLE_PY.encode()})
        assert (server.repo / "double" / "4" / "model.py").read_text() == DOUBLE_PY
        with pytest.raises(InferenceServerException) as err:
            client.load_model("double", config=json.dumps(config), files={"file:/etc/cron.d/x": b"x"})
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(InferenceServerException) as err:
            client.load_model("../double", config=json.dumps(config), files={"file:1/model.py": b"x"})
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert client.is_model_ready("double")
    finally:
        client.close()
