"""Convert between ProtoFile, FileDescriptorProto and .proto text.

Why this exists: confluent_kafka's ProtobufSerializer does not register .proto text but
a base64-encoded serialized FileDescriptorProto (`_schema_to_str`), and its deserializer
fetches schemas with `?format=serialized`, expecting that form back. Confluent's registry
accepts both forms, stores text and converts on the way out. These functions give the
REST layer the same abilities:

* `from_descriptor` — a FileDescriptorProto (decoded from base64) to a ProtoFile;
* `to_descriptor` — a ProtoFile to a FileDescriptorProto, laid out the way protoc lays
  it out (map entry types inserted where the map field is declared, synthetic oneofs
  for proto3 `optional`), because the message indexes in each Kafka record address
  nested types by position;
* `render_proto` — a ProtoFile to .proto text.

Custom options are read from a descriptor when the pool protoc compiled it into is
given (broker/registry/protobuf/protoc.py) and kept as text in the ProtoFile, but not
encoded back into descriptors; standard options are.
"""

from __future__ import annotations

import contextvars
import re
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from broker.registry.protobuf.model import (
    MAX_FIELD_NUMBER,
    SCALARS,
    ProtoEnum,
    ProtoField,
    ProtoFile,
    ProtoMessage,
    ProtoMethod,
    ProtoService,
    resolve_type,
)

_FDP = descriptor_pb2.FieldDescriptorProto
_SCALAR_TYPES: dict[str, int] = {name: getattr(_FDP, f"TYPE_{name.upper()}") for name in SCALARS}
_TYPE_SCALARS = {number: name for name, number in _SCALAR_TYPES.items()}
_POOL: contextvars.ContextVar[descriptor_pool.DescriptorPool | None] = contextvars.ContextVar(
    "proto_pool", default=None
)


# -- descriptor -> ProtoFile -------------------------------------------------------------


def from_descriptor(
    fdp: descriptor_pb2.FileDescriptorProto, pool: descriptor_pool.DescriptorPool | None = None
) -> ProtoFile:
    """The ProtoFile of a descriptor; with the `pool` it was compiled into, custom options
    (extensions of the *Options messages, e.g. ``(confluent.field_meta)``) are kept too."""
    token = _POOL.set(pool)
    try:
        return _file_from(fdp)
    finally:
        _POOL.reset(token)


def _file_from(fdp: descriptor_pb2.FileDescriptorProto) -> ProtoFile:
    syntax = fdp.syntax or "proto2"
    pf = ProtoFile(
        syntax=syntax,
        package=fdp.package,
        imports=list(fdp.dependency),
        public_imports=[fdp.dependency[i] for i in fdp.public_dependency],
        weak_imports=[fdp.dependency[i] for i in fdp.weak_dependency],
        options=_options_to_dict(fdp.options),
    )
    if syntax == "editions":
        pf.edition = descriptor_pb2.Edition.Name(fdp.edition).removeprefix("EDITION_")
    pf.messages = [_message_from(m, fdp.package, syntax) for m in fdp.message_type]
    pf.enums = [_enum_from(e, fdp.package) for e in fdp.enum_type]
    for service in fdp.service:
        pf.services.append(
            ProtoService(
                service.name,
                [
                    ProtoMethod(
                        m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming
                    )
                    for m in service.method
                ],
            )
        )
    return pf


def _message_from(dp: descriptor_pb2.DescriptorProto, scope: str, syntax: str) -> ProtoMessage:
    full = f"{scope}.{dp.name}" if scope else dp.name
    msg = ProtoMessage(dp.name, full, options=_options_to_dict(dp.options))
    entries = {f".{full}.{n.name}": n for n in dp.nested_type if n.options.map_entry}
    synthetic = {f.oneof_index for f in dp.field if f.proto3_optional and f.HasField("oneof_index")}
    msg.oneofs = [o.name for i, o in enumerate(dp.oneof_decl) if i not in synthetic]
    for f in dp.field:
        msg.fields.append(_field_from(f, dp, entries, synthetic, syntax))
    position = 0
    for nested in dp.nested_type:
        if nested.options.map_entry:
            for f in dp.field:
                if f.type_name == f".{full}.{nested.name}":
                    msg.map_entry_positions[f.name] = position
        else:
            msg.messages.append(_message_from(nested, full, syntax))
            position += 1
    msg.enums = [_enum_from(e, full) for e in dp.enum_type]
    msg.reserved_numbers = [(r.start, r.end - 1) for r in dp.reserved_range]
    msg.reserved_names = list(dp.reserved_name)
    msg.extension_ranges = [(r.start, r.end - 1) for r in dp.extension_range]
    return msg


def _field_from(
    f: descriptor_pb2.FieldDescriptorProto,
    dp: descriptor_pb2.DescriptorProto,
    entries: dict[str, descriptor_pb2.DescriptorProto],
    synthetic: set[int],
    syntax: str,
) -> ProtoField:
    oneof = None
    if f.HasField("oneof_index") and f.oneof_index not in synthetic:
        oneof = dp.oneof_decl[f.oneof_index].name
    type_name = _TYPE_SCALARS.get(f.type) or f.type_name
    if f.label == _FDP.LABEL_REPEATED and f.type_name in entries:
        entry = {e.number: e for e in entries[f.type_name].field}
        key = _TYPE_SCALARS.get(entry[1].type) or entry[1].type_name
        value = _TYPE_SCALARS.get(entry[2].type) or entry[2].type_name
        return ProtoField(
            f.name,
            f.number,
            f"map<{key}, {value}>",
            None,
            None,
            key,
            value,
            options=_options_to_dict(f.options),
        )
    if f.label == _FDP.LABEL_REPEATED:
        label: str | None = "repeated"
    elif f.label == _FDP.LABEL_REQUIRED:
        label = "required"
    elif syntax == "proto2":
        label = None if oneof else "optional"
    else:
        label = "optional" if f.proto3_optional else None
    default = f.default_value if f.HasField("default_value") else None
    group = f.type == _FDP.TYPE_GROUP
    if group:  # a group names the nested message it declares, as in .proto source
        type_name = type_name.rsplit(".", 1)[-1]
    return ProtoField(
        f.name,
        f.number,
        type_name,
        label,
        oneof,
        default=default,
        group=group,
        options=_options_to_dict(f.options),
    )


def _enum_from(ep: descriptor_pb2.EnumDescriptorProto, scope: str) -> ProtoEnum:
    enum = ProtoEnum(
        ep.name,
        f"{scope}.{ep.name}" if scope else ep.name,
        {v.name: v.number for v in ep.value},
        _options_to_dict(ep.options),
    )
    enum.reserved_numbers = [(r.start, r.end) for r in ep.reserved_range]  # end inclusive here
    enum.reserved_names = list(ep.reserved_name)
    return enum


def _options_to_dict(options: Message) -> dict[str, str]:
    """Options set on a descriptor, as .proto literals (custom ones given a pool)."""
    out: dict[str, str] = {}
    for fd, value in _with_extensions(options).ListFields():
        if fd.is_extension and not fd.is_repeated:
            out[f"({fd.full_name})"] = (
                "{ " + text_format.MessageToString(value, as_one_line=True) + " }"
                if fd.type == FieldDescriptor.TYPE_MESSAGE
                else _literal(fd, value)
            )
            continue
        if fd.is_extension or fd.is_repeated or fd.name in ("map_entry", "features"):
            continue
        literal = _literal(fd, value)
        if literal is not None:
            out[fd.name] = literal
    return out


def _with_extensions(options: Message) -> Message:
    """`options` decoded with the compiling pool, so that its extensions are fields."""
    pool = _POOL.get()
    if pool is None:
        return options
    try:
        descriptor = pool.FindMessageTypeByName(options.DESCRIPTOR.full_name)
    except KeyError:  # descriptor.proto not imported: no custom option can be set
        return options
    return message_factory.GetMessageClass(descriptor).FromString(options.SerializeToString())


def _literal(fd: FieldDescriptor, value: Any) -> Any:
    if fd.type == FieldDescriptor.TYPE_STRING:
        return quote(value)
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return "true" if value else "false"
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return fd.enum_type.values_by_number[value].name
    if fd.type != FieldDescriptor.TYPE_MESSAGE:
        return str(value)
    return None


# -- ProtoFile -> descriptor -------------------------------------------------------------


def to_descriptor(pf: ProtoFile, name: str = "schema.proto") -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto protoc would produce for `pf` (standard options only)."""
    fdp = descriptor_pb2.FileDescriptorProto(name=name)
    if pf.package:
        fdp.package = pf.package
    fdp.dependency.extend(pf.imports)
    fdp.public_dependency.extend(pf.imports.index(p) for p in pf.public_imports)
    fdp.weak_dependency.extend(pf.imports.index(p) for p in pf.weak_imports)
    if pf.syntax == "proto3":
        fdp.syntax = "proto3"
    elif pf.syntax == "editions":
        fdp.syntax = "editions"
        edition = f"EDITION_{pf.edition}"
        if edition in descriptor_pb2.Edition.keys():  # noqa: SIM118 (an EnumTypeWrapper)
            fdp.edition = descriptor_pb2.Edition.Value(edition)
    _apply_options(fdp, pf.options)
    table = pf.type_table()
    for message in pf.messages:
        _message_to(fdp.message_type.add(), message, pf, table)
    for enum in pf.enums:
        _enum_to(fdp.enum_type.add(), enum)
    for service in pf.services:
        sp = fdp.service.add(name=service.name)
        for method in service.methods:
            mp = sp.method.add(
                name=method.name,
                input_type=_type_ref(method.input_type, pf.package, table)[1],
                output_type=_type_ref(method.output_type, pf.package, table)[1],
            )
            if method.client_streaming:
                mp.client_streaming = True
            if method.server_streaming:
                mp.server_streaming = True
    return fdp


def _type_ref(name: str, scope: str, table: dict[str, ProtoMessage | ProtoEnum]) -> tuple[int, str]:
    """(descriptor type, type_name). Unresolved names are left for the DescriptorPool."""
    if name in _SCALAR_TYPES:
        return _SCALAR_TYPES[name], ""
    full = resolve_type(name, scope, table)
    if full is None:
        return 0, name
    kind = _FDP.TYPE_ENUM if isinstance(table[full], ProtoEnum) else _FDP.TYPE_MESSAGE
    return kind, f".{full}"


def map_entry_name(field_name: str) -> str:
    """protoc's MapEntryName: CamelCase of the field name plus "Entry"."""
    out, cap = [], True
    for char in field_name:
        if char == "_":
            cap = True
        elif cap:
            out.append(char.upper() if "a" <= char <= "z" else char)
            cap = False
        else:
            out.append(char)
    return "".join(out) + "Entry"


def _message_to(  # noqa: C901 (descriptor.proto's message fields one by one)
    dp: descriptor_pb2.DescriptorProto,
    msg: ProtoMessage,
    pf: ProtoFile,
    table: dict[str, ProtoMessage | ProtoEnum],
) -> None:
    dp.name = msg.name
    _apply_options(dp, msg.options)
    for name in msg.oneofs:
        dp.oneof_decl.add(name=name)
    entries: list[tuple[int, descriptor_pb2.DescriptorProto]] = []
    for fld in msg.fields:
        fp = dp.field.add(name=fld.name, number=fld.number)
        _apply_options(fp, fld.options)
        if fld.is_map:
            entry = _map_entry(fld, msg, table)
            entries.append((msg.map_entry_positions.get(fld.name, len(msg.messages)), entry))
            fp.label, fp.type = _FDP.LABEL_REPEATED, _FDP.TYPE_MESSAGE
            fp.type_name = f".{msg.full_name}.{entry.name}"
            continue
        fp.label = {"repeated": _FDP.LABEL_REPEATED, "required": _FDP.LABEL_REQUIRED}.get(
            fld.label or "", _FDP.LABEL_OPTIONAL
        )
        kind, type_name = _type_ref(fld.type, msg.full_name, table)
        if fld.group:
            kind = _FDP.TYPE_GROUP
        if kind:
            fp.type = kind
        if type_name:
            fp.type_name = type_name
        if fld.default is not None:
            fp.default_value = fld.default
        if fld.oneof is not None:
            fp.oneof_index = msg.oneofs.index(fld.oneof)
    for fld, fp in zip(msg.fields, dp.field, strict=True):
        if fld.label == "optional" and pf.syntax != "proto2":
            fp.proto3_optional = True
            fp.oneof_index = len(dp.oneof_decl)
            dp.oneof_decl.add(name=_synthetic_oneof_name(fld.name, msg))
    pending = sorted(entries, key=lambda e: e[0])  # stable: declaration order on ties
    for index, child in enumerate(msg.messages):
        while pending and pending[0][0] <= index:
            dp.nested_type.add().CopyFrom(pending.pop(0)[1])
        _message_to(dp.nested_type.add(), child, pf, table)
    for _, entry in pending:
        dp.nested_type.add().CopyFrom(entry)
    for enum in msg.enums:
        _enum_to(dp.enum_type.add(), enum)
    for low, high in msg.reserved_numbers:
        dp.reserved_range.add(start=low, end=min(high, MAX_FIELD_NUMBER) + 1)
    dp.reserved_name.extend(msg.reserved_names)
    for low, high in msg.extension_ranges:
        dp.extension_range.add(start=low, end=min(high, MAX_FIELD_NUMBER) + 1)


def _synthetic_oneof_name(field_name: str, msg: ProtoMessage) -> str:
    """protoc names the oneof of a proto3 optional field "_name", prefixing X on clashes."""
    name = f"_{field_name}"
    taken = set(msg.oneofs) | {f.name for f in msg.fields}
    while name in taken:
        name = "X" + name
    return name


def _map_entry(
    fld: ProtoField, msg: ProtoMessage, table: dict[str, ProtoMessage | ProtoEnum]
) -> descriptor_pb2.DescriptorProto:
    entry = descriptor_pb2.DescriptorProto(name=map_entry_name(fld.name))
    entry.options.map_entry = True
    for number, field_name, type_name in ((1, "key", fld.key_type), (2, "value", fld.value_type)):
        fp = entry.field.add(name=field_name, number=number, label=_FDP.LABEL_OPTIONAL)
        kind, ref = _type_ref(type_name or "", msg.full_name, table)
        if kind:
            fp.type = kind
        if ref:
            fp.type_name = ref
    return entry


def _enum_to(ep: descriptor_pb2.EnumDescriptorProto, enum: ProtoEnum) -> None:
    ep.name = enum.name
    for name, number in enum.values.items():
        ep.value.add(name=name, number=number)
    _apply_options(ep, enum.options)
    for low, high in enum.reserved_numbers:
        ep.reserved_range.add(start=low, end=high)
    ep.reserved_name.extend(enum.reserved_names)


def _apply_options(parent: Message, values: dict[str, str]) -> None:
    """Set parent.options from `values`, leaving the options field unset when none apply."""
    _options_from_dict(parent.options, values)
    if not parent.options.ListFields():
        parent.ClearField("options")


def _options_from_dict(options: Message, values: dict[str, str]) -> None:
    """Set the standard options named in `values`; custom "(ext)" options are skipped."""
    fields = options.DESCRIPTOR.fields_by_name
    for name, literal in values.items():
        fd = fields.get(name)
        if fd is None or fd.is_repeated:
            continue
        text = unquote_option(literal)
        value: Any
        try:
            if fd.type == FieldDescriptor.TYPE_BOOL:
                value = text == "true"
            elif fd.type == FieldDescriptor.TYPE_ENUM:
                value = fd.enum_type.values_by_name[text].number
            elif fd.type == FieldDescriptor.TYPE_STRING:
                value = text
            elif fd.cpp_type in (FieldDescriptor.CPPTYPE_FLOAT, FieldDescriptor.CPPTYPE_DOUBLE):
                value = float(text)
            elif fd.type != FieldDescriptor.TYPE_MESSAGE:
                value = int(text, 0)
            else:
                continue
            setattr(options, name, value)
        except (KeyError, ValueError, TypeError):
            continue


# -- ProtoFile -> .proto text -------------------------------------------------------------


def render_proto(pf: ProtoFile) -> str:
    """.proto source for `pf`; parsing it again gives an equivalent ProtoFile."""
    out: list[str] = []
    if pf.syntax == "editions":
        out.append(f"edition = {quote(pf.edition or '2023')};")
    else:
        out.append(f"syntax = {quote(pf.syntax)};")
    if pf.package:
        out.append(f"package {pf.package};")
    for path in pf.imports:
        kind = (
            "public " if path in pf.public_imports else "weak " if path in pf.weak_imports else ""
        )
        out.append(f"import {kind}{quote(path)};")
    out += [f"option {name} = {value};" for name, value in pf.options.items()]
    for message in pf.messages:
        out += _render_message(message, pf, 0)
    for enum in pf.enums:
        out += _render_enum(enum, 0)
    for service in pf.services:
        out.append(f"service {service.name} {{")
        for m in service.methods:
            request = f"stream {m.input_type}" if m.client_streaming else m.input_type
            response = f"stream {m.output_type}" if m.server_streaming else m.output_type
            out.append(f"  rpc {m.name}({request}) returns ({response});")
        out.append("}")
    return "\n".join(out) + "\n"


def _render_ranges(ranges: list[tuple[int, int]], top: int) -> str:
    parts = []
    for low, high in ranges:
        parts.append(str(low) if low == high else f"{low} to {'max' if high >= top else high}")
    return ", ".join(parts)


def _render_message(  # noqa: C901 (one branch per element of a .proto message)
    msg: ProtoMessage, pf: ProtoFile, depth: int, group: ProtoField | None = None
) -> list[str]:
    pad = "  " * depth
    inner = pad + "  "
    if group is not None:
        label = f"{group.label} " if group.label else ""
        out = [f"{pad}{label}group {msg.name} = {group.number}{_render_options(group.options)} {{"]
    else:
        out = [f"{pad}message {msg.name} {{"]
    out += [f"{inner}option {name} = {value};" for name, value in msg.options.items()]
    if msg.reserved_numbers:
        out.append(f"{inner}reserved {_render_ranges(msg.reserved_numbers, MAX_FIELD_NUMBER)};")
    if msg.reserved_names:
        out.append(f"{inner}reserved {', '.join(quote(n) for n in msg.reserved_names)};")
    if msg.extension_ranges:
        out.append(f"{inner}extensions {_render_ranges(msg.extension_ranges, MAX_FIELD_NUMBER)};")
    # Declarations are emitted so that the nested types protoc creates (map entries,
    # groups) land at the same positions among the nested messages: message indexes
    # on the wire depend on them.
    index_of = {m.name: i for i, m in enumerate(msg.messages)}
    emitted: set[int] = set()

    def flush_nested(before: int) -> None:
        for i in range(before):
            if i not in emitted:
                emitted.add(i)
                out.extend(_render_message(msg.messages[i], pf, depth + 1))

    def emit(fld: ProtoField, indent: int) -> None:
        if fld.group:
            flush_nested(index_of[fld.type])
            emitted.add(index_of[fld.type])
            out.extend(_render_message(msg.messages[index_of[fld.type]], pf, indent, fld))
            return
        if fld.is_map:
            flush_nested(msg.map_entry_positions.get(fld.name, 0))
        out.append("  " * indent + _render_field(fld))

    done_oneofs: set[str] = set()
    for fld in msg.fields:
        if fld.oneof is None:
            emit(fld, depth + 1)
        elif fld.oneof not in done_oneofs:
            done_oneofs.add(fld.oneof)
            out.append(f"{inner}oneof {fld.oneof} {{")
            for member in msg.fields:
                if member.oneof == fld.oneof:
                    emit(member, depth + 2)
            out.append(f"{inner}}}")
    for oneof in msg.oneofs:
        if oneof not in done_oneofs:  # an empty oneof is legal, if useless
            out += [f"{inner}oneof {oneof} {{", f"{inner}}}"]
    flush_nested(len(msg.messages))
    for enum in msg.enums:
        out += _render_enum(enum, depth + 1)
    out.append(f"{pad}}}")
    return out


def _render_field(fld: ProtoField) -> str:
    options = dict(fld.options)
    if fld.default is not None:
        options["default"] = (
            fld.default if fld.type not in ("string", "bytes") else quote(fld.default)
        )
    label = f"{fld.label} " if fld.label else ""
    return f"{label}{fld.type} {fld.name} = {fld.number}{_render_options(options)};"


def _render_options(options: dict[str, str]) -> str:
    if not options:
        return ""
    return " [" + ", ".join(f"{name} = {value}" for name, value in options.items()) + "]"


def _render_enum(enum: ProtoEnum, depth: int) -> list[str]:
    pad = "  " * depth
    out = [f"{pad}enum {enum.name} {{"]
    out += [f"{pad}  option {name} = {value};" for name, value in enum.options.items()]
    if enum.reserved_numbers:
        out.append(f"{pad}  reserved {_render_ranges(enum.reserved_numbers, 2**31 - 1)};")
    if enum.reserved_names:
        out.append(f"{pad}  reserved {', '.join(quote(n) for n in enum.reserved_names)};")
    out += [f"{pad}  {name} = {number};" for name, number in enum.values.items()]
    out.append(f"{pad}}}")
    return out


# -- .proto string literals ---------------------------------------------------------------

_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}


def quote(text: str) -> str:
    """A double-quoted .proto string literal for `text`."""
    out = []
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\{ord(char):03o}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def unquote_option(value: str) -> str:
    """An option value as stored (a literal) back to its plain text."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return _unquote(value)
    return value


def _unquote(literal: str) -> str:
    body = literal[1:-1]

    def replace(match: re.Match[str]) -> str:
        esc = match.group(1)
        if esc[0] in "xX":
            return chr(int(esc[1:], 16))
        if esc[0].isdigit():
            return chr(int(esc, 8))
        return _ESCAPES.get(esc, esc)

    return re.sub(r"\\([xX][0-9a-fA-F]{1,2}|[0-7]{1,3}|.)", replace, body)
