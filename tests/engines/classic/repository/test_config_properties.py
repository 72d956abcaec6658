"""Properties of `config.pbtxt` loading (`engines.classic.repository.config`, `loading`, `repository`, `batching`).

An operator's typo, or a repository-load request's config, must never take the server down:
- any text at all fails only with `ConfigError` (a `ValueError`) whose message names the file;
- text built from `ModelConfig`'s own fields, with values of any size, does the same, and a
  config that loads can be scheduled (its batcher and version selection build at once);
- every valid config generated here loads, with the fields it was written with.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as mc

from engines.classic.errors import ConfigError
from engines.classic.loading import read_config
from engines.classic.repository.disk import select_versions
from engines.classic.scheduling.batching import BatcherConfig, BatchQueue
from tests.properties import bounded

NAME = "m"


@contextmanager
def model_dir(text: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / NAME
        (d / "1").mkdir(parents=True)
        (d / "config.pbtxt").write_text(text, encoding="utf-8", errors="surrogatepass")
        yield d


def load_or_refuse(text: str) -> mc.ModelConfig | None:
    """Load and schedule `text`'s config; None when it is refused the one allowed way."""
    with model_dir(text) as d:
        try:
            config = read_config(d, None)
            BatchQueue(BatcherConfig.from_model_config(config))
            select_versions(config, d)
        except ConfigError as exc:
            assert str(d / "config.pbtxt") in str(exc), exc
            return None
        return config


@bounded(300)
@given(text=st.text(max_size=200))
def test_arbitrary_text_is_refused_naming_the_file(text: str) -> None:
    load_or_refuse(text)


@bounded(200)
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_are_refused_naming_the_file(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / NAME
        d.mkdir()
        (d / "config.pbtxt").write_bytes(raw)
        try:
            read_config(d, None)
        except ConfigError as exc:
            assert str(d / "config.pbtxt") in str(exc)


# ---- text from ModelConfig's own schema ---------------------------------------------------------
_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}
_names = st.sampled_from(["x", "y", NAME, "", "a b", "m\\x00"])


def _int_text(field: FieldDescriptor) -> st.SearchStrategy[str]:
    low, high = _INT_RANGES.get(field.type, (-(2**63), 2**64))
    return st.one_of(st.integers(-3, 70), st.integers(low, high), st.sampled_from([low, high])).map(str)


def _scalar_text(field: FieldDescriptor) -> st.SearchStrategy[str]:
    if field.type == FieldDescriptor.TYPE_STRING or field.type == FieldDescriptor.TYPE_BYTES:
        return st.one_of(_names, st.text(alphabet="abcxyz_01 ./\\\"", max_size=8)).map(
            lambda s: '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"')
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.sampled_from(["true", "false"])
    if field.type == FieldDescriptor.TYPE_ENUM:
        names = [v.name for v in field.enum_type.values]
        return st.one_of(st.sampled_from(names), st.integers(-2, 40).map(str))
    if field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr)
    return _int_text(field)


def _field_text(field: FieldDescriptor, depth: int) -> st.SearchStrategy[str]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        value = _message_text(field.message_type, depth + 1)
        if field.is_repeated:
            return st.lists(value, max_size=3).map(lambda vs: f"{field.name} [ {', '.join(vs)} ]")
        return value.map(lambda v: f"{field.name} {v}")
    value = _scalar_text(field)
    if field.is_repeated:
        return st.lists(value, max_size=4).map(lambda vs: f"{field.name}: [ {', '.join(vs)} ]")
    return value.map(lambda v: f"{field.name}: {v}")


def _message_text(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[str]:
    if depth > 3 or not descriptor.fields:
        return st.just("{ }")
    fields = st.lists(st.sampled_from(list(descriptor.fields)), max_size=6, unique_by=lambda f: f.name)
    return fields.flatmap(lambda fs: st.tuples(*(_field_text(f, depth) for f in fs))).map(
        lambda parts: "{ " + " ".join(parts) + " }")


@st.composite
def model_config_texts(draw: st.DrawFn) -> str:
    """A valid config with some of its fields, and others, rewritten from ModelConfig's schema:
    most of each text passes validation, so the field under test is the one that decides."""
    fields = mc.ModelConfig.DESCRIPTOR.fields_by_name
    lines = dict(draw(valid_config_lines()))
    for name in draw(st.lists(st.sampled_from(sorted(lines)), max_size=2, unique=True)):
        lines[name] = draw(_field_text(fields[name], 0))
    others = ["dynamic_batching", "instance_group", "version_policy", "ensemble_scheduling", "parameters",
              "platform", "name", "sequence_batching", "optimization", "model_warmup"]
    for name in draw(st.lists(st.sampled_from(others), max_size=2, unique=True)):
        lines[name] = draw(_field_text(fields[name], 0))
    return "\n".join(draw(st.permutations(list(lines.values()))))


@bounded(400)
@given(text=model_config_texts())
def test_configs_built_from_the_schema_load_or_are_refused_naming_the_file(text: str) -> None:
    load_or_refuse(text)


# ---- valid configs -----------------------------------------------------------------------------
data_types = st.sampled_from(["TYPE_BOOL", "TYPE_UINT8", "TYPE_INT8", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16",
                              "TYPE_FP32", "TYPE_FP64", "TYPE_STRING", "TYPE_UINT64"])
tensor_dims = st.lists(st.one_of(st.just(-1), st.integers(1, 4096)), min_size=1, max_size=4)
tensor_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=12)


@st.composite
def valid_config_cases(draw: st.DrawFn) -> tuple[list[tuple[str, str]], dict[str, object]]:
    """(top-level field, its text) pairs of a valid config, and what loading it must give."""
    max_batch = draw(st.integers(0, 1024))
    names = draw(st.lists(tensor_names, min_size=2, max_size=6, unique=True))
    n_inputs = draw(st.integers(1, len(names) - 1))
    tensors = {n: (draw(data_types), draw(tensor_dims)) for n in names}

    def block(kind: str, which: list[str]) -> tuple[str, str]:
        items = [f'{{ name: "{n}" data_type: {tensors[n][0]} dims: [ {", ".join(map(str, tensors[n][1]))} ] }}'
                 for n in which]
        return kind, f"{kind} [ {', '.join(items)} ]"

    backend = draw(st.sampled_from(["onnxruntime", "python", "pytorch"]))
    lines = [("backend", f'backend: "{backend}"'), ("max_batch_size", f"max_batch_size: {max_batch}"),
             block("input", names[:n_inputs]), block("output", names[n_inputs:])]
    expected: dict[str, object] = {"backend": backend, "max_batch_size": max_batch, "tensors": tensors,
                                   "inputs": names[:n_inputs]}
    if max_batch and draw(st.booleans()):
        levels = draw(st.integers(0, 8))
        preferred = draw(st.lists(st.integers(1, max_batch), max_size=3))
        delay = draw(st.integers(0, 10**7))
        text = f"max_queue_delay_microseconds: {delay} preferred_batch_size: [ {', '.join(map(str, preferred))} ]"
        if levels:
            text += f" priority_levels: {levels} default_priority_level: {draw(st.integers(1, levels))}"
        lines.append(("dynamic_batching", f"dynamic_batching {{ {text} }}"))
        expected.update(delay=delay, preferred=sorted(preferred), levels=max(1, levels))
    if draw(st.booleans()):
        lines.append(("instance_group", f"instance_group [ {{ count: {draw(st.integers(1, 8))} kind: KIND_CPU }} ]"))
    return draw(st.permutations(lines)), expected


def valid_config_lines() -> st.SearchStrategy[list[tuple[str, str]]]:
    return valid_config_cases().map(lambda case: case[0])


def valid_configs() -> st.SearchStrategy[tuple[str, dict[str, object]]]:
    return valid_config_cases().map(lambda case: ("\n".join(line for _, line in case[0]), case[1]))


@bounded(200)
@given(case=valid_configs())
def test_valid_configs_load_with_their_fields(case: tuple[str, dict[str, object]]) -> None:
    text, expected = case
    config = load_or_refuse(text)
    assert config is not None, text
    assert config.name == NAME and config.backend == expected["backend"]
    assert config.max_batch_size == expected["max_batch_size"]
    tensors = expected["tensors"]
    assert isinstance(tensors, dict)
    loaded = {t.name: (mc.DataType.Name(t.data_type), list(t.dims)) for t in [*config.input, *config.output]}
    assert loaded == {n: (t, d) for n, (t, d) in tensors.items()}
    assert [t.name for t in config.input] == expected["inputs"]
    batcher = BatcherConfig.from_model_config(config)
    if "delay" in expected:
        assert batcher.max_queue_delay_us == expected["delay"]
        assert list(batcher.preferred_batch_sizes) == expected["preferred"]
        assert batcher.priority_levels == expected["levels"]


def test_priority_levels_are_bounded_before_the_batcher_builds_a_queue_per_level() -> None:
    base = ('backend: "python" max_batch_size: 4 input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ] '
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ] ')
    assert load_or_refuse(base + "dynamic_batching { priority_levels: 1024 }") is not None
    with model_dir(base + "dynamic_batching { priority_levels: 18446744073709551615 }") as d:
        try:
            read_config(d, None)
        except ConfigError as exc:
            assert "dynamic_batching.priority_levels" in str(exc) and str(d) in str(exc)
        else:
            raise AssertionError("a config with 2**64 - 1 priority levels loaded")


def test_an_unknown_data_type_number_is_refused_naming_the_file() -> None:
    # proto3 enums are open: the text format accepts any number where an enum name goes.
    text = ('backend: "python" input [ { name: "x" data_type: 99 dims: [ 1 ] } ] '
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]')
    with model_dir(text) as d:
        try:
            read_config(d, None)
        except ConfigError as exc:
            assert "data_type" in str(exc) and str(d) in str(exc)
        else:
            raise AssertionError("data_type 99 loaded")
