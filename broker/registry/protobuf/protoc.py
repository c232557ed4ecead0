"""Compile `.proto` text with protoc, in process, into FileDescriptorProtos.

Why: protoc is the reference parser and checker of the language (grammar, field numbers,
reserved ranges, labels per syntax, enum rules, type and option resolution, imports),
so the registry uses it instead of a parser of its own. grpcio-tools ships it as a
Python extension; ``grpc_tools._protoc_compiler.get_protos`` is the entry point
``grpc.protos()`` uses to import .proto files at run time: it compiles a file and its
imports from include directories and returns the generated Python modules, or raises
``ProtocErrors`` with the file, line, column (both counted from 0) and message of each
error. The modules hold each file's serialized FileDescriptorProto as the bytes literal
handed to ``AddSerializedFile``; it is read back from their syntax tree.

protoc reads files, so a schema and the sources of its imports are written to a
temporary directory per compilation. The well-known google/protobuf/*.proto files come
with grpcio-tools; the Confluent ones (confluent/meta.proto and the decimal types, which
Confluent's registry also knows without a reference) are below, as their descriptors in
confluent_kafka define them.
"""

from __future__ import annotations

import ast
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import grpc_tools
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_tools import _protoc_compiler

from broker.registry.errors import InvalidSchemaError

MAIN = "__schema__.proto"  # the file name the schema being parsed is compiled under
_WELL_KNOWN = str(Path(grpc_tools.__file__).parent / "_proto")
_LOCK = threading.Lock()  # one protoc at a time: its error collector is process-wide

CONFLUENT_SOURCES = {
    "confluent/meta.proto": """syntax = "proto3";
package confluent;
import "google/protobuf/descriptor.proto";
option go_package = "../confluent";
message Meta {
  string doc = 1;
  map<string, string> params = 2;
  repeated string tags = 3;
  repeated Rule rules = 4;
}
message Rule {
  string name = 1;
  string doc = 2;
  string expr = 3;
  string sql = 4;
}
extend google.protobuf.FileOptions { Meta file_meta = 1088; }
extend google.protobuf.MessageOptions { Meta message_meta = 1088; }
extend google.protobuf.FieldOptions { Meta field_meta = 1088; }
extend google.protobuf.EnumOptions { Meta enum_meta = 1088; }
extend google.protobuf.EnumValueOptions { Meta enum_value_meta = 1088; }
""",
    "confluent/type/decimal.proto": """syntax = "proto3";
package confluent.type;
message Decimal {
  bytes value = 1;
  uint32 precision = 2;
  int32 scale = 3;
}
""",
    "confluent/types/decimal.proto": """syntax = "proto3";
import public "confluent/type/decimal.proto";
""",
}


class Compiled:
    """A compiled schema: its descriptor, those of every file it imports (by name), and a
    pool holding them all (to read custom options)."""

    def __init__(self, files: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
        self.main = files.pop(MAIN)
        self.imports = files
        self.pool = descriptor_pool.DescriptorPool()
        added: set[str] = set()

        def add(fdp: descriptor_pb2.FileDescriptorProto) -> None:
            if fdp.name in added:
                return
            for dep in fdp.dependency:
                add(files[dep] if dep != MAIN else self.main)
            added.add(fdp.name)
            self.pool.Add(fdp)

        add(self.main)


def compile_proto(text: str, sources: Mapping[str, str], what: str) -> Compiled:
    """Compile `text`, whose imports are found in `sources` (import path -> .proto text),
    the Confluent files above or the well-known ones. Raises InvalidSchemaError naming
    `what` ("Protobuf schema") and the line and column of the first problem."""
    with tempfile.TemporaryDirectory(prefix="icefall-proto-") as tmp:
        root = Path(tmp)
        for path, body in {**CONFLUENT_SOURCES, **sources, MAIN: text}.items():
            target = root / _safe_path(path, what)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(body, encoding="utf-8")
        with _LOCK:
            try:
                modules = _protoc_compiler.get_protos(
                    MAIN.encode(), [str(root).encode(), _WELL_KNOWN.encode()]
                )
            except _protoc_compiler.ProtocErrors as exc:
                raise InvalidSchemaError(_message(exc.errors(), what)) from None
    files = {}
    for _, code in modules:
        fdp = descriptor_pb2.FileDescriptorProto.FromString(_serialized_file(code))
        files[fdp.name] = fdp
    _check_implementation_numbers(files[MAIN].message_type, what)
    try:
        return Compiled(files)
    except (TypeError, KeyError) as exc:  # the runtime's pool refusing what protoc took
        raise InvalidSchemaError(f"Invalid {what}: {exc}") from None


def _check_implementation_numbers(
    messages: Iterable[descriptor_pb2.DescriptorProto], what: str
) -> None:
    """Field numbers 19000-19999 are reserved for the protobuf implementation; the protoc
    of grpcio-tools lets them through, the runtimes that decode records refuse them."""
    for message in messages:
        for fld in message.field:
            if 19000 <= fld.number <= 19999:
                raise InvalidSchemaError(
                    f"Invalid {what}: field '{fld.name}' of message '{message.name}' uses "
                    f"number {fld.number}: 19000 to 19999 are reserved for the protobuf "
                    "implementation"
                )
        _check_implementation_numbers(message.nested_type, what)


def _safe_path(path: str, what: str) -> PurePosixPath:
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise InvalidSchemaError(f"Invalid {what}: import path {path!r} is not a relative path")
    return pure


def _message(errors: list[Any], what: str) -> str:
    """The first error in the schema itself (else the first in an import), located."""
    found = [(_text(e.filename), e) for e in errors]
    filename, first = next(((f, e) for f, e in found if f == MAIN), found[0])
    where = f"line {first.line + 1}:{first.column + 1}"
    if filename != MAIN:
        where = f"in '{filename}'" if first.line < 0 else f"in '{filename}' {where}"
    return f"Invalid {what}: {where}: {_text(first.message)}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _serialized_file(code: bytes) -> bytes:
    """The FileDescriptorProto bytes a generated _pb2 module registers."""
    for node in ast.walk(ast.parse(code)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, bytes)
        ):
            return node.args[0].value
    raise InvalidSchemaError("Invalid Protobuf schema: protoc produced no descriptor")
