"""Compile an Avro schema into a validator program for ``broker._gate``.

The data quality gate checks every Avro value produced to a table topic. fastavro
decodes ~10 µs a record; the C validator runs a small bytecode program instead,
compiled here once per schema id. A program answers one question: does this
byte string decode, consuming all of it, with this writer schema?

Layout (little-endian): ``b"AVP1" | u32 nfuncs | u32 offset[nfuncs] | code``.
Function 0 is the entry; each function runs its opcodes until ``RET``. Named
records are functions of their own, so references and recursion (a linked list)
are calls; array items, map values and union branches are functions too.

What is checked, per type:

- null: nothing; boolean: one byte, 0 or 1;
- int: a zigzag varint whose value fits 32 bits; long: a varint of at most 10 bytes;
- float, double: 4 and 8 bytes;
- bytes, string: a length >= 0, then that many bytes; strings must be UTF-8
  (as strict as Python's decoder, which fastavro uses);
- fixed(n): n bytes; enum: an index in [0, symbols); union: an index in [0, branches)
  then that branch;
- array, map: blocks of a count (a negative count is followed by a byte size),
  then the items (map: a string key, then the value), until a zero count;
- record: the fields in order;
- logical types: their underlying type, plus the checks that make fastavro's
  conversion fail: date, time and timestamp ranges (exact); uuid strings that are
  not plainly 32 hex digits (with or without the 8-4-4-4-12 dashes) and decimals
  with unusual parameters or more than 1 KiB of digits are *deferred*: the gate
  asks fastavro about those values.

The C side is stricter than fastavro in a few places, on purpose: booleans must be
0 or 1, ints must fit 32 bits, enum and union indexes must not be negative (fastavro
indexes Python lists with them), varints are at most 10 bytes, nesting is limited to
``broker._gate.MAX_DEPTH`` levels (fastavro segfaults past a few thousand), and an
array of zero-byte items (nulls) holds at most ``MAX_ZERO_WIDTH_ITEMS``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

MAGIC = b"AVP1"
NO_FUNC = 0xFFFFFFFF

OP_RET = 0
OP_BOOLEAN = 1
OP_INT = 2
OP_LONG = 3
OP_FLOAT = 4
OP_DOUBLE = 5
OP_BYTES = 6
OP_STRING = 7
OP_FIXED = 8  # u32 size
OP_ENUM = 9  # u32 symbols
OP_UNION = 10  # u32 n, u32 func[n]
OP_ARRAY = 11  # u32 items func, u8 zero-width items
OP_MAP = 12  # u32 values func
OP_CALL = 13  # u32 func
OP_INT_RANGE = 14  # i32 lo, i32 hi
OP_LONG_RANGE = 15  # i64 lo, i64 hi
OP_STRING_UUID = 16
OP_BYTES_DECIMAL = 17
OP_DEFER = 18
OP_ACCEPT_ALL = 19

# The values fastavro's logical readers convert without an error: date.fromordinal,
# datetime.time(h, m, s, us) and epoch + timedelta must stay within Python's ranges.
_INT_RANGES = {
    "int-date": (-719162, 2932896),
    "int-time-millis": (-3599999, 86399999),
}
_MILLIS = (-62135596800000, 253402300799999)
_MICROS = (-62135596800000000, 253402300799999999)
_LONG_RANGES = {
    "long-time-micros": (-3599999999, 86399999999),
    "long-timestamp-millis": _MILLIS,
    "long-local-timestamp-millis": _MILLIS,
    "long-timestamp-micros": _MICROS,
    "long-local-timestamp-micros": _MICROS,
}
_MAX_DECIMAL_PRECISION = 1000  # beyond: let fastavro judge (Context precision limits)

_PRIMITIVES = {
    "null": None,
    "boolean": OP_BOOLEAN,
    "int": OP_INT,
    "long": OP_LONG,
    "float": OP_FLOAT,
    "double": OP_DOUBLE,
    "bytes": OP_BYTES,
    "string": OP_STRING,
}
_NAMED = ("record", "error", "enum", "fixed")


class AvroProgramError(ValueError):
    """The schema has a shape the compiler does not handle (the gate then uses fastavro)."""


def _logical_readers() -> frozenset[str]:
    try:
        from fastavro.read import LOGICAL_READERS

        return frozenset(LOGICAL_READERS)
    except ImportError:  # pragma: no cover
        return frozenset()


_FASTAVRO_LOGICAL = _logical_readers()


def accept_all_program() -> bytes:
    """A program every byte string passes (schema types the gate does not check)."""
    return MAGIC + struct.pack("<II", 1, 0) + bytes([OP_ACCEPT_ALL, OP_RET])


def compile_schema(schema: Any) -> bytes:
    """The validator program for a fastavro-parsed schema, or for an Avro schema as
    JSON (text, or the loaded dict/list/str), which fastavro parses first."""
    return _Compiler(_parsed(schema)).program()


def _parsed(schema: Any) -> Any:
    from fastavro import parse_schema

    if isinstance(schema, dict) and schema.get("__fastavro_parsed"):
        return schema
    if isinstance(schema, str) and schema.strip()[:1] in ("{", "[", '"'):
        schema = json.loads(schema)
    try:
        return parse_schema(schema)
    except Exception as exc:  # fastavro raises SchemaParseException, UnknownType, KeyError...
        raise AvroProgramError(
            f"fastavro cannot parse the schema: {type(exc).__name__}: {exc}"
        ) from exc


class _Compiler:
    def __init__(self, parsed: Any) -> None:
        self.root = parsed
        self.named: dict[str, dict[str, Any]] = {}
        if isinstance(parsed, dict):
            self.named.update(parsed.get("__named_schemas") or {})
        self._collect(parsed)
        self.funcs: list[bytearray] = []
        self.records: dict[str, int] = {}

    def _collect(self, node: Any) -> None:
        """Named types defined inline (a top-level union carries no ``__named_schemas``)."""
        if isinstance(node, list):
            for branch in node:
                self._collect(branch)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in _NAMED and isinstance(node.get("name"), str):
                self.named.setdefault(node["name"], node)
            if kind in ("record", "error"):
                for f in node.get("fields") or []:
                    if isinstance(f, dict):
                        self._collect(f.get("type"))
            elif kind == "array":
                self._collect(node.get("items"))
            elif kind == "map":
                self._collect(node.get("values"))

    def program(self) -> bytes:
        entry = self._new_func()
        self._emit(self.funcs[entry], self.root)
        self.funcs[entry].append(OP_RET)
        offsets = []
        pos = 0
        for code in self.funcs:
            offsets.append(pos)
            pos += len(code)
        return (
            MAGIC + struct.pack(f"<I{len(offsets)}I", len(offsets), *offsets) + b"".join(self.funcs)
        )

    # ------------------------------------------------------------ helpers

    def _new_func(self) -> int:
        self.funcs.append(bytearray())
        return len(self.funcs) - 1

    def _resolve(self, node: Any, seen: tuple[str, ...] = ()) -> tuple[str, Any]:
        """(kind, definition): kind is a primitive name, a complex type, or "union"."""
        if isinstance(node, str):
            if node in _PRIMITIVES:
                return node, {}
            if node in self.named and node not in seen:
                return self._resolve(self.named[node], (*seen, node))
            raise AvroProgramError(f"unknown type {node!r}")
        if isinstance(node, list):
            return "union", node
        if isinstance(node, dict):
            kind = node.get("type")
            if isinstance(kind, str) and (
                kind in _PRIMITIVES or kind in _NAMED or kind in ("array", "map")
            ):
                return kind, node
            raise AvroProgramError(f"unsupported type node {str(node)[:200]}")
        raise AvroProgramError(f"unsupported schema node {node!r}")

    @staticmethod
    def _logical(kind: str, node: Any) -> str | None:
        logical = node.get("logicalType") if isinstance(node, dict) else None
        if not isinstance(logical, str):
            return None
        key = f"{kind}-{logical}"
        return key if key in _FASTAVRO_LOGICAL else None

    @staticmethod
    def _decimal_ok(node: dict[str, Any]) -> bool:
        precision = node.get("precision")
        scale = node.get("scale", 0)
        return (
            type(precision) is int
            and 1 <= precision <= _MAX_DECIMAL_PRECISION
            and type(scale) is int
            and 0 <= scale <= precision
        )

    def _zero_width(self, node: Any, visiting: frozenset[str] = frozenset()) -> bool:
        """True if every value of the type takes no bytes at all (null, fixed(0), such records)."""
        kind, d = self._resolve(node)
        if kind == "null":
            return True
        if kind == "fixed":
            logical = self._logical(kind, d)
            return d.get("size") == 0 and (
                logical is None or (logical == "fixed-decimal" and self._decimal_ok(d))
            )
        if kind in ("record", "error"):
            name = d.get("name")
            if name in visiting:
                return False
            return all(
                self._zero_width(f["type"], visiting | {name}) for f in d.get("fields") or []
            )
        return False

    def _func_for(self, node: Any) -> int:
        """A function that checks one value of the type (NO_FUNC for null)."""
        kind, d = self._resolve(node)
        if kind == "null":
            return NO_FUNC
        if kind in ("record", "error"):
            return self._record(d)
        func = self._new_func()
        self._emit(self.funcs[func], node)
        self.funcs[func].append(OP_RET)
        return func

    def _record(self, d: dict[str, Any]) -> int:
        name = d.get("name")
        if not isinstance(name, str):
            raise AvroProgramError("a record without a name")
        if name in self.records:
            return self.records[name]
        func = self._new_func()
        self.records[name] = func  # before the fields: recursive references call it
        code = bytearray()
        fields = d.get("fields")
        if not isinstance(fields, list):
            raise AvroProgramError(f"record {name} has no field list")
        for f in fields:
            if not isinstance(f, dict) or "type" not in f:
                raise AvroProgramError(f"record {name} has a malformed field")
            self._emit(code, f["type"])
        code.append(OP_RET)
        self.funcs[func] = code
        return func

    # ------------------------------------------------------------ code

    def _emit(self, code: bytearray, node: Any) -> None:  # noqa: C901 (one branch per Avro type, in the order of the spec)
        kind, d = self._resolve(node)
        logical = self._logical(kind, d)
        if kind == "null":
            return
        if kind in _PRIMITIVES:
            if logical in _INT_RANGES:
                code.append(OP_INT_RANGE)
                code += struct.pack("<ii", *_INT_RANGES[logical])
            elif logical in _LONG_RANGES:
                code.append(OP_LONG_RANGE)
                code += struct.pack("<qq", *_LONG_RANGES[logical])
            elif logical == "string-uuid":
                code.append(OP_STRING_UUID)
            elif logical == "bytes-decimal":
                if not self._decimal_ok(d):
                    code.append(OP_DEFER)
                code.append(OP_BYTES_DECIMAL)
            else:
                if logical is not None:  # a conversion this compiler does not know: fastavro's word
                    code.append(OP_DEFER)
                op = _PRIMITIVES[kind]
                assert op is not None
                code.append(op)
            return
        if kind in ("record", "error"):
            code.append(OP_CALL)
            code += struct.pack("<I", self._record(d))
        elif kind == "fixed":
            size = d.get("size")
            if type(size) is not int or not 0 <= size < 2**32:
                raise AvroProgramError(f"fixed {d.get('name')} has size {size!r}")
            if logical is not None and not (
                logical == "fixed-decimal" and self._decimal_ok(d) and size <= 1024
            ):
                code.append(OP_DEFER)
            code.append(OP_FIXED)
            code += struct.pack("<I", size)
        elif kind == "enum":
            symbols = d.get("symbols")
            if not isinstance(symbols, list):
                raise AvroProgramError(f"enum {d.get('name')} has no symbol list")
            code.append(OP_ENUM)
            code += struct.pack("<I", len(symbols))
        elif kind == "union":
            branches = [self._func_for(b) for b in d]
            code.append(OP_UNION)
            code += struct.pack(f"<I{len(branches)}I", len(branches), *branches)
        elif kind == "array":
            if "items" not in d:
                raise AvroProgramError("an array without items")
            zero_width = self._zero_width(d["items"])
            code.append(OP_ARRAY)
            code += struct.pack("<IB", self._func_for(d["items"]), zero_width)
        elif kind == "map":
            if "values" not in d:
                raise AvroProgramError("a map without values")
            code.append(OP_MAP)
            code += struct.pack("<I", self._func_for(d["values"]))
        else:  # pragma: no cover - _resolve returns only the kinds above
            raise AvroProgramError(f"unsupported type {kind}")
