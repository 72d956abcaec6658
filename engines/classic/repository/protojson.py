"""Protobuf JSON dicts in Triton's style: 64-bit integers as numbers.

`json_format.MessageToDict` writes int64 as strings ("dims": ["4"]); Triton's
JSON has numbers, so `fix_int64` converts them back, guided by the descriptor.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


def fix_int64(desc: Descriptor, data: dict[str, Any]) -> dict[str, Any]:
    for key, value in data.items():
        field = desc.fields_by_name.get(key)
        if field is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            data[key] = {k: _convert(value_field, v) for k, v in value.items()}
        elif _is_repeated(field):
            data[key] = [_convert(field, v) for v in value]
        else:
            data[key] = _convert(field, value)
    return data


def _convert(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None and isinstance(value, dict):
        return fix_int64(field.message_type, value)
    if field.type in _INT64 and isinstance(value, str):
        return int(value)
    return value


def _is_repeated(field: FieldDescriptor) -> bool:
    is_repeated = getattr(field, "is_repeated", None)  # protobuf >= 6 deprecates .label
    if is_repeated is not None:
        return bool(is_repeated)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)
