"""The classic path's bounds: names, shapes, timeouts, priorities, queue sizes and the Sluice config parameters."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from engines.classic.errors import ConfigError, InferError
from engines.classic.limits import (
    MAX_TIMEOUT_US,
    ClassicLimits,
    check_priority,
    check_timeout,
    element_count,
    execute_timeout_s,
    isolation,
)
from engines.classic.repository.names import check_model_name
from engines.classic.scheduling.batching import BatcherConfig
from engines.errors import ErrorKind


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse('name: "m" backend: "python" ' + text, mc.ModelConfig())


@pytest.mark.parametrize("name", ["digits_onnx", "all-minilm-l6-v2", "_private", "v1.2", "a" * 128, "0"])
def test_plain_model_names_pass(name):
    assert check_model_name(name) == name


@pytest.mark.parametrize("name", ["", "..", "a..b", "../etc", "a/b", "a\\b", "/abs", "x\0y", ".hidden", "-x",
                                  "a" * 129, "é", "a b"])
def test_other_model_names_are_invalid(name):
    with pytest.raises(InferError) as err:
        check_model_name(name)
    assert err.value.kind == ErrorKind.INVALID_ARG


def test_element_count_does_not_overflow():
    with pytest.raises(InferError, match="1208925819614629174706176 elements"):
        element_count("x", [2**40, 2**40], 64 * 2**20)  # int64 would wrap this to 0
    with pytest.raises(InferError, match="negative"):
        element_count("x", [4, -1], 100)
    with pytest.raises(InferError, match="more than the 100 allowed"):
        element_count("x", [11, 10], 100)
    assert element_count("x", [10, 10], 100) == 100
    assert element_count("x", [], 100) == 1


@pytest.mark.parametrize("timeout_us", [-1, MAX_TIMEOUT_US + 1, 2**63 - 1, 10**400])
def test_timeouts_out_of_range(timeout_us):
    with pytest.raises(InferError, match="'timeout'"):
        check_timeout(timeout_us)


def test_timeouts_in_range():
    check_timeout(0)
    check_timeout(MAX_TIMEOUT_US)


def test_priority_within_the_model_levels():
    three = _config("max_batch_size: 4 dynamic_batching { priority_levels: 3 default_priority_level: 2 }")
    for p in (0, 1, 3):
        check_priority(three, p)
    none = _config("max_batch_size: 4")
    for p in (0, 1):
        check_priority(none, p)
    for config, p in ((three, 4), (three, -1), (none, 2), (three, 2**64)):
        with pytest.raises(InferError, match="'priority'") as err:
            check_priority(config, p)
        assert err.value.kind == ErrorKind.INVALID_ARG


def test_server_default_queue_bound_applies_where_the_config_sets_none():
    plain = BatcherConfig.from_model_config(_config("max_batch_size: 4"), 7)
    assert plain.default_policy.max_queue_size == 7
    dyn = BatcherConfig.from_model_config(_config(
        "max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 2 value { default_timeout_microseconds: 5 } } }"), 7)
    assert dyn.default_policy.max_queue_size == 7 and dyn.policy(2).max_queue_size == 7
    own = BatcherConfig.from_model_config(_config(
        "max_batch_size: 4 dynamic_batching { default_queue_policy { max_queue_size: 3 } }"), 7)
    assert own.default_policy.max_queue_size == 3


def test_execute_timeout_parameter():
    limits = ClassicLimits(execute_timeout_s=300.0)
    assert execute_timeout_s(_config(""), limits, "src") == 300.0
    param = 'parameters { key: "execute_timeout_s" value { string_value: "%s" } }'
    assert execute_timeout_s(_config(param % "2.5"), limits, "src") == 2.5
    assert execute_timeout_s(_config(param % "0"), limits, "src") == 0.0
    for bad in ("-1", "soon", "inf", "nan"):
        with pytest.raises(ConfigError, match=r"src: field 'parameters\.execute_timeout_s'"):
            execute_timeout_s(_config(param % bad), limits, "src")


def test_isolation_parameter():
    param = 'parameters { key: "isolation" value { string_value: "%s" } }'
    assert isolation(_config(""), "src") == "none"
    assert isolation(_config(param % "process"), "src") == "process"
    with pytest.raises(ConfigError, match="must be one of"):
        isolation(_config(param % "container"), "src")
    onnx = text_format.Parse('name: "m" backend: "onnxruntime" ' + param % "process", mc.ModelConfig())
    with pytest.raises(ConfigError, match="python models only"):
        isolation(onnx, "src")


def test_limits_validate_themselves():
    with pytest.raises(ValueError):
        ClassicLimits(max_queue_size=0)
    with pytest.raises(ValueError):
        ClassicLimits(execute_timeout_s=float("inf"))
