"""The parsed form of a .proto file, built from its descriptor (protobuf/descriptor.py).

Only what the registry needs is kept: the type tree (messages, enums, services), each
field's name, number, declared type and label, oneof membership and the reserved
ranges. Field types are kept as written ("int32", "Inner", ".pkg.Outer.Inner") and
resolved on demand with protobuf's scoping rules, so that a schema registered as text
and the same schema registered as a serialized descriptor compare equal.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

SCALARS = frozenset(
    {
        "double",
        "float",
        "int32",
        "int64",
        "uint32",
        "uint64",
        "sint32",
        "sint64",
        "fixed32",
        "fixed64",
        "sfixed32",
        "sfixed64",
        "bool",
        "string",
        "bytes",
    }
)
MAX_FIELD_NUMBER = 536_870_911
RESERVED_IMPLEMENTATION_RANGE = (19_000, 19_999)


@dataclass
class ProtoField:
    """One field. `label` is "optional", "required", "repeated" or None (proto3 implicit).

    Map fields have type "map<K, V>" with key_type/value_type set; proto2 groups have
    `group` set and the type names the nested message the group defines.
    """

    name: str
    number: int
    type: str
    label: str | None = None
    oneof: str | None = None
    key_type: str | None = None
    value_type: str | None = None
    default: str | None = None
    group: bool = False
    options: dict[str, str] = field(default_factory=dict)

    @property
    def is_map(self) -> bool:
        return self.key_type is not None

    @property
    def repeated(self) -> bool:
        return self.label == "repeated" or self.is_map


@dataclass
class ProtoEnum:
    name: str
    full_name: str
    values: dict[str, int] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)
    reserved_numbers: list[tuple[int, int]] = field(default_factory=list)
    reserved_names: list[str] = field(default_factory=list)


@dataclass
class ProtoMessage:
    name: str
    full_name: str
    fields: list[ProtoField] = field(default_factory=list)
    oneofs: list[str] = field(default_factory=list)
    messages: list[ProtoMessage] = field(default_factory=list)
    enums: list[ProtoEnum] = field(default_factory=list)
    reserved_numbers: list[tuple[int, int]] = field(default_factory=list)  # inclusive ranges
    reserved_names: list[str] = field(default_factory=list)
    extension_ranges: list[tuple[int, int]] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)  # values are .proto literals
    # map field name -> how many nested messages precede its synthesized MapEntry type;
    # protoc inserts the entry there, and message indexes on the wire depend on it.
    map_entry_positions: dict[str, int] = field(default_factory=dict)


@dataclass
class ProtoMethod:
    name: str
    input_type: str
    output_type: str
    client_streaming: bool = False
    server_streaming: bool = False


@dataclass
class ProtoService:
    name: str
    methods: list[ProtoMethod] = field(default_factory=list)


@dataclass
class ProtoFile:
    """A whole .proto file. `dependencies` holds the parsed imported files we could load."""

    syntax: str = "proto2"
    package: str = ""
    imports: list[str] = field(default_factory=list)
    public_imports: list[str] = field(default_factory=list)
    weak_imports: list[str] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)
    messages: list[ProtoMessage] = field(default_factory=list)
    enums: list[ProtoEnum] = field(default_factory=list)
    services: list[ProtoService] = field(default_factory=list)
    edition: str | None = None
    dependencies: dict[str, ProtoFile] = field(default_factory=dict)

    def all_messages(self) -> Iterator[ProtoMessage]:
        """Every message of this file, nested ones included, outermost first."""
        stack = list(reversed(self.messages))
        while stack:
            message = stack.pop()
            yield message
            stack.extend(reversed(message.messages))

    def all_enums(self) -> Iterator[ProtoEnum]:
        yield from self.enums
        for message in self.all_messages():
            yield from message.enums

    def type_table(self) -> TypeTable:
        """Full name -> type, for this file and (transitively) every loaded dependency."""
        table = TypeTable()
        seen: set[int] = set()
        todo = [self]
        while todo:
            current = todo.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            for message in current.all_messages():
                table.setdefault(message.full_name, message)
            for enum in current.all_enums():
                table.setdefault(enum.full_name, enum)
            todo.extend(current.dependencies.values())
        return table


class TypeTable(dict[str, "ProtoMessage | ProtoEnum"]):
    """Full type name -> definition, plus the set of names a scope lookup can stop at."""

    @functools.cached_property
    def symbols(self) -> frozenset[str]:
        """Types and every prefix of their names (packages and enclosing messages)."""
        out: set[str] = set()
        for name in self:
            parts = name.split(".")
            out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        return frozenset(out)


def resolve_type(name: str, scope: str, table: dict[str, ProtoMessage | ProtoEnum]) -> str | None:
    """The full name `name` refers to from inside `scope`, by protoc's rules, or None.

    ".a.B" is absolute. Otherwise the first component of the name is looked up from the
    innermost scope outwards; the first scope where it names a type or package decides,
    and the rest of the name must then exist there (protoc does not search further out).
    """
    if name.startswith("."):
        return name[1:] if name[1:] in table else None
    symbols = table.symbols if isinstance(table, TypeTable) else frozenset(table)
    first = name.split(".", 1)[0]
    parts = scope.split(".") if scope else []
    for depth in range(len(parts), -1, -1):
        prefix = ".".join(parts[:depth] + [first])
        if prefix in symbols:
            candidate = ".".join(parts[:depth] + [name])
            return candidate if candidate in table else None
    return None
