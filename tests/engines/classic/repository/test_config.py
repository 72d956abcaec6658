"""config.pbtxt parsing and validation: errors name the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from engines.classic.errors import ConfigError, InferError
from engines.classic.repository.config import load_config
from engines.classic.repository.disk import select_versions
from engines.classic.repository.uploads import replace_files
from engines.classic.scheduling.batching import BatcherConfig

GOOD = '''
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 priority_levels: 2 default_priority_level: 1
                   default_queue_policy { max_queue_size: 3 } }
'''


def _model(tmp_path: Path, text: str, name: str = "m", versions=(1,)) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.pbtxt").write_text(text)
    for v in versions:
        (d / str(v)).mkdir()
    return d


def test_good_config_defaults_name_and_batcher(tmp_path):
    config = load_config(_model(tmp_path, GOOD))
    assert config.name == "m" and config.backend == "onnxruntime"
    batcher = BatcherConfig.from_model_config(config)
    assert batcher.dynamic and batcher.max_queue_delay_us == 100 and batcher.priority_levels == 2
    assert batcher.default_policy.max_queue_size == 3


def test_platform_maps_to_backend(tmp_path):
    config = load_config(_model(tmp_path, GOOD.replace('backend: "onnxruntime"', 'platform: "onnxruntime_onnx"')))
    assert config.backend == "onnxruntime"


@pytest.mark.parametrize("text, fragment", [
    (GOOD.replace("dims: [ 4 ]", "dims: [ -2 ]"), "dims[0]"),
    (GOOD.replace("TYPE_FP32 dims: [ 4 ]", "TYPE_BANANA dims: [ 4 ]"), "TYPE_BANANA"),
    (GOOD.replace('backend: "onnxruntime"', 'backend: "tensorrt"'), "field 'backend'"),
    (GOOD.replace("max_batch_size: 8", 'max_batch_size: 8\nname: "other"'), "field 'name'"),
    (GOOD + "dynamic_batching { preferred_batch_size: [ 16 ] }", "malformed"),
    ("input [ { name: ", "malformed config"),
    (GOOD.replace('output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]', ""), "field 'output'"),
])
def test_bad_configs_name_file_and_field(tmp_path, text, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(_model(tmp_path, text))
    assert "m/config.pbtxt" in str(err.value) and fragment in str(err.value)


def test_preferred_batch_size_bounded(tmp_path):
    text = GOOD.replace("max_queue_delay_microseconds: 100", "preferred_batch_size: [ 16 ]")
    with pytest.raises(ConfigError, match="preferred_batch_size"):
        load_config(_model(tmp_path, text))


def test_missing_config(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match=r"missing config\.pbtxt"):
        load_config(tmp_path / "m")


def test_version_policies(tmp_path):
    d = _model(tmp_path, GOOD, versions=(1, 2, 10))
    config = mc.ModelConfig()
    assert select_versions(config, d) == [10]
    config.version_policy.latest.num_versions = 2
    assert select_versions(config, d) == [2, 10]
    config.version_policy.all.SetInParent()
    assert select_versions(config, d) == [1, 2, 10]
    config.version_policy.specific.versions[:] = [1, 2]
    assert select_versions(config, d) == [1, 2]
    config.version_policy.specific.versions[:] = [3]
    with pytest.raises(ConfigError, match=r"version_policy\.specific"):
        select_versions(config, d)


def test_no_versions(tmp_path):
    with pytest.raises(ConfigError, match="at least one version"):
        select_versions(mc.ModelConfig(), _model(tmp_path, GOOD, versions=()))


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "1/../../x", "", "1/x\0y", "1\\..\\..\\x"])
def test_file_params_confined_to_model_dir(tmp_path, rel):
    d = _model(tmp_path, GOOD)
    with pytest.raises(InferError):
        replace_files(d, {rel: b"x"})
    assert not (tmp_path / "x").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [d.name]  # nothing staged is left behind


def test_file_params_written(tmp_path):
    d = _model(tmp_path, GOOD)
    replace_files(d, {"2/model.py": b"hi"}).commit()
    assert (d / "2" / "model.py").read_bytes() == b"hi"
