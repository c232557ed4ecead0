"""Protobuf schemas in their two wire forms, on top of compat_protobuf's parser.

Clients register ``.proto`` text, or (confluent-kafka's ProtobufSerializer) the
base64 of a serialized ``FileDescriptorProto``; deserializers ask for the text (the
default) or ``?format=serialized``. Like Confluent's registry, this one stores the
canonical ``.proto`` text (so both forms of one schema are the same schema, with one
id) and converts on the way out.

``normalize`` (the ``?normalize=true`` of register, lookup and compatibility, or the
subject's ``normalize`` config) orders what Confluent's ProtobufSchemaUtils orders when it
normalizes: options by name at every level, imports by path, fields by number and enum
constants by number. The order of messages and enums is kept: message indexes on the
wire depend on it.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from broker.registry.errors import InvalidSchemaError


def parse(text: str, deps: dict[str, str]) -> Any:
    """compat_protobuf's ProtoFile for ``text`` (either form); InvalidSchemaError."""
    from broker.registry.protobuf.compat import parse_proto

    try:
        return parse_proto(text, deps)
    except InvalidSchemaError:
        raise
    except RecursionError:
        raise InvalidSchemaError("Invalid Protobuf schema: nested too deeply") from None
    except Exception as exc:  # a parser gap must still be a 42201, never a 500  # noqa: BLE001
        raise InvalidSchemaError(f"Invalid Protobuf schema: {exc}") from None


def canonical(text: str, deps: dict[str, str], normalize: bool = False) -> tuple[str, Any]:
    """(canonical ``.proto`` text, ProtoFile) of a schema in either form."""
    from broker.registry.protobuf.descriptor import render_proto

    model = parse(text, deps)
    if normalize:
        model = normalized(model)
    return render_proto(model), model


def _option_key(name: str) -> str:
    """Options sort by name, parentheses of custom options aside (Wire's OptionElement)."""
    return name.replace("(", "").replace(")", "")


def _sorted_options(options: dict[str, str]) -> dict[str, str]:
    return {name: options[name] for name in sorted(options, key=_option_key)}


def normalized(model: Any) -> Any:
    """A copy of a ProtoFile in Confluent's normalized order (see the module docstring)."""
    from broker.registry.protobuf.model import ProtoEnum

    out = copy.deepcopy(model)
    out.options = _sorted_options(out.options)
    out.imports = sorted(dict.fromkeys(out.imports))
    enums: list[ProtoEnum] = list(out.all_enums())
    for message in out.all_messages():
        message.options = _sorted_options(message.options)
        message.fields.sort(key=lambda f: f.number)
        for fld in message.fields:
            fld.options = _sorted_options(fld.options)
    for enum in enums:
        enum.options = _sorted_options(enum.options)
        enum.values = dict(sorted(enum.values.items(), key=lambda item: (item[1], item[0])))
    return out


def as_text(stored: str) -> str:
    """The ``.proto`` text of a stored schema (records written by other registries may
    hold the serialized form)."""
    from broker.registry.protobuf.compat import is_serialized_descriptor

    if not is_serialized_descriptor(stored):
        return stored
    return canonical(stored, {})[0]


def as_serialized(stored: str, deps: dict[str, str], name: str = "schema.proto") -> str:
    """The base64 FileDescriptorProto of a stored schema (``?format=serialized``)."""
    from broker.registry.protobuf.descriptor import to_descriptor

    fd = to_descriptor(parse(stored, deps), name)
    return base64.standard_b64encode(fd.SerializeToString()).decode("ascii")
