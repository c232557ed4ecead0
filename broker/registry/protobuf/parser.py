"""A small recursive-descent parser for .proto files (proto2, proto3 and editions).

It has to accept whatever a client registers — hand-written files and the text other
registries render from descriptors — so it understands the whole grammar (options with
aggregate values, groups, extensions, services, streams, reserved ranges) but keeps only
what the registry uses. It also applies the checks protoc would make that matter for
compatibility, so a schema that could never be compiled is rejected with a line and
column: field numbers out of range or reused, reserved numbers or names reused,
`required` in proto3, an enum without a zero first value in proto3, duplicate enum
values without allow_alias, and types that resolve nowhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from broker.registry.errors import InvalidSchemaError
from broker.registry.protobuf.model import (
    MAX_FIELD_NUMBER,
    RESERVED_IMPLEMENTATION_RANGE,
    SCALARS,
    ProtoEnum,
    ProtoField,
    ProtoFile,
    ProtoMessage,
    ProtoMethod,
    ProtoService,
    resolve_type,
)

_TOKEN_RE = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<number>(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?![A-Za-z_]))
  | (?P<ident>\.?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<symbol>[{}\[\]()<>;=,:+\-/.])
""",
    re.VERBOSE | re.DOTALL,
)


@dataclass
class _Token:
    kind: str  # ident, number, string, symbol, eof
    value: str
    line: int
    col: int


def tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if match is None:
            if text.startswith("/*", pos):
                raise InvalidSchemaError(
                    f"Invalid Protobuf schema: line {line}:{pos - line_start + 1}: unterminated comment"
                )
            raise InvalidSchemaError(
                f"Invalid Protobuf schema: line {line}:{pos - line_start + 1}: unexpected character "
                f"{text[pos]!r}"
            )
        kind = match.lastgroup or ""
        value = match.group()
        if kind not in ("space", "comment"):
            tokens.append(_Token(kind, value, line, pos - line_start + 1))
        newlines = value.count("\n") if kind in ("space", "comment") else 0
        if newlines:
            line += newlines
            line_start = pos + match.group().rfind("\n") + 1
        pos = match.end()
    tokens.append(_Token("eof", "", line, pos - line_start + 1))
    return tokens


def parse_proto_text(text: str) -> ProtoFile:
    """Parse .proto source; types are checked later, once imports are known."""
    return _Parser(tokenize(text)).parse_file()


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.file = ProtoFile()

    # -- token helpers ----------------------------------------------------------------

    @property
    def tok(self) -> _Token:
        return self.tokens[self.pos]

    def error(self, message: str, tok: _Token | None = None) -> InvalidSchemaError:
        tok = tok or self.tok
        found = "end of input" if tok.kind == "eof" else repr(tok.value)
        return InvalidSchemaError(
            f"Invalid Protobuf schema: line {tok.line}:{tok.col}: {message} (found {found})"
        )

    def peek(self, ahead: int) -> _Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def next(self) -> _Token:
        tok = self.tok
        if tok.kind != "eof":
            self.pos += 1
        return tok

    def accept(self, value: str) -> bool:
        if self.tok.value == value and self.tok.kind in ("symbol", "ident"):
            self.pos += 1
            return True
        return False

    def expect(self, value: str) -> _Token:
        if not (self.tok.value == value and self.tok.kind in ("symbol", "ident")):
            raise self.error(f"expected '{value}'")
        return self.next()

    def ident(self, what: str = "an identifier") -> str:
        if self.tok.kind != "ident":
            raise self.error(f"expected {what}")
        return self.next().value

    def simple_name(self, what: str) -> str:
        tok = self.tok
        name = self.ident(what)
        if "." in name:
            raise self.error(f"expected {what} without dots", tok)
        return name

    def string(self) -> str:
        if self.tok.kind != "string":
            raise self.error("expected a string")
        parts = []
        while self.tok.kind == "string":
            parts.append(_unquote(self.next().value))
        return "".join(parts)

    def integer(self, what: str) -> int:
        tok = self.tok
        negative = self.accept("-")
        if tok.kind == "symbol" and not negative or self.tok.kind != "number":
            raise self.error(f"expected {what}")
        raw = self.next().value
        try:
            value = int(raw, 0) if not re.fullmatch(r"0[0-7]+", raw) else int(raw, 8)
        except ValueError:
            raise self.error(f"expected an integer {what}", tok) from None
        return -value if negative else value

    # -- file level -------------------------------------------------------------------

    def parse_file(self) -> ProtoFile:
        first = True
        while self.tok.kind != "eof":
            word = self.tok.value
            if self.accept(";"):
                continue
            if word == "syntax" and self.peek(1).value == "=":
                if not first:
                    raise self.error("'syntax' must be the first statement")
                self.syntax()
            elif word == "edition" and self.peek(1).value == "=":
                self.next()
                self.expect("=")
                self.file.syntax, self.file.edition = "editions", self.string()
                self.expect(";")
            elif word == "package":
                self.next()
                if self.file.package:
                    raise self.error("multiple package statements")
                self.file.package = self.ident("a package name")
                self.expect(";")
            elif word == "import":
                self.import_()
            elif word == "option":
                self.option_statement(self.file.options)
            elif word == "message":
                self.file.messages.append(self.message(self.file.package))
            elif word == "enum":
                self.file.enums.append(self.enum(self.file.package))
            elif word == "service":
                self.file.services.append(self.service())
            elif word == "extend":
                self.extend(self.file.package, ProtoMessage("", self.file.package))
            else:
                raise self.error("expected a top-level statement")
            first = False
        return self.file

    def syntax(self) -> None:
        self.next()
        self.expect("=")
        tok = self.tok
        value = self.string()
        if value not in ("proto2", "proto3"):
            raise self.error(f"unknown syntax {value!r}: expected 'proto2' or 'proto3'", tok)
        self.file.syntax = value
        self.expect(";")

    def import_(self) -> None:
        self.next()
        kind = ""
        if self.tok.value in ("public", "weak") and self.tok.kind == "ident":
            kind = self.next().value
        path = self.string()
        self.file.imports.append(path)
        if kind == "public":
            self.file.public_imports.append(path)
        elif kind == "weak":
            self.file.weak_imports.append(path)
        self.expect(";")

    # -- options ----------------------------------------------------------------------

    def option_statement(self, into: dict[str, str]) -> None:
        self.expect("option")
        name, value = self.option_assignment()
        into[name] = value
        self.expect(";")

    def option_assignment(self) -> tuple[str, str]:
        parts: list[str] = []
        while not (self.tok.kind == "symbol" and self.tok.value == "="):
            if self.tok.kind == "eof" or self.tok.value in (";", "{", "}", "]"):
                raise self.error("expected '=' in option")
            parts.append(self.next().value)
        if not parts:
            raise self.error("expected an option name")
        self.expect("=")
        return "".join(parts), self.option_value()

    def option_value(self) -> str:
        tok = self.tok
        if tok.value == "{" and tok.kind == "symbol":
            return self.aggregate()
        if tok.kind == "string":
            return quote(self.string())  # kept as a literal so it can be rendered back
        sign = ""
        if tok.value in ("-", "+") and tok.kind == "symbol":
            sign = self.next().value.replace("+", "")
        if self.tok.kind in ("number", "ident"):
            return sign + self.next().value
        raise self.error("expected an option value")

    def aggregate(self) -> str:
        """A text-format message value `{ ... }`: kept verbatim, braces balanced."""
        depth, parts = 0, []
        while True:
            tok = self.next()
            if tok.kind == "eof":
                raise self.error("unterminated option value", tok)
            parts.append(tok.value)
            if tok.kind == "symbol" and tok.value == "{":
                depth += 1
            elif tok.kind == "symbol" and tok.value == "}":
                depth -= 1
                if depth == 0:
                    return " ".join(parts)

    def field_options(self) -> dict[str, str]:
        options: dict[str, str] = {}
        if self.accept("["):
            while True:
                name, value = self.option_assignment()
                options[name] = value
                if self.accept("]"):
                    break
                self.expect(",")
        return options

    # -- messages ---------------------------------------------------------------------

    def message(self, scope: str) -> ProtoMessage:
        self.expect("message")
        name = self.simple_name("a message name")
        message = ProtoMessage(name, f"{scope}.{name}" if scope else name)
        self.expect("{")
        self.message_body(message)
        self.check_message(message)
        return message

    def message_body(self, message: ProtoMessage) -> None:
        while not self.accept("}"):
            word = self.tok.value
            if self.tok.kind == "eof":
                raise self.error(f"expected '}}' to close message '{message.name}'")
            if self.accept(";"):
                continue
            if self.tok.kind != "ident":
                raise self.error("expected a field or a declaration")
            if word == "message" and self.peek(1).kind == "ident":
                message.messages.append(self.message(message.full_name))
            elif word == "enum" and self.peek(1).kind == "ident":
                message.enums.append(self.enum(message.full_name))
            elif word == "option" and self.peek(1).value != "=":
                self.option_statement(message.options)
            elif word == "oneof" and self.peek(1).kind == "ident":
                self.oneof(message)
            elif word == "reserved" and "=" not in (self.peek(1).value, self.peek(2).value):
                self.reserved(message.reserved_numbers, message.reserved_names)
            elif word == "extensions" and self.peek(1).kind == "number":
                self.next()
                self.ranges(message.extension_ranges)
                self.field_options()
                self.expect(";")
            elif word == "extend" and self.peek(1).kind == "ident":
                self.extend(message.full_name, message)
            else:
                message.fields.append(self.field(message, None))

    def field(self, message: ProtoMessage, oneof: str | None) -> ProtoField:
        start = self.tok
        label: str | None = None
        if (
            oneof is None
            and self.tok.value in ("optional", "required", "repeated")
            and self.peek(1).kind == "ident"
            and self.peek(2).value not in ("=",)
        ):
            label = self.next().value
            if label == "required" and self.file.syntax == "proto3":
                raise self.error("required fields are not allowed in proto3", start)
        if self.tok.value == "map" and self.peek(1).value == "<":
            return self.map_field(message, label, oneof, start)
        if (
            self.tok.value == "group"
            and self.peek(1).kind == "ident"
            and self.peek(2).value == "="
            and self.peek(4).value in ("{", "[")
        ):
            return self.group(message, label, oneof)
        type_name = self.ident("a field type")
        name = self.simple_name("a field name")
        self.expect("=")
        number = self.integer("a field number")
        options = self.field_options()
        self.expect(";")
        if self.file.syntax == "proto2" and label is None and oneof is None:
            raise self.error(
                f"field '{name}' needs a label (optional, required or repeated) in proto2", start
            )
        default = options.pop("default", None)
        if default is not None:
            default = unquote_option(default)
        return ProtoField(name, number, type_name, label, oneof, default=default, options=options)

    def map_field(
        self, message: ProtoMessage, label: str | None, oneof: str | None, start: _Token
    ) -> ProtoField:
        if label is not None or oneof is not None:
            raise self.error("map fields cannot have labels or be in a oneof", start)
        self.next()
        self.expect("<")
        tok = self.tok
        key = self.ident("a map key type")
        if key not in SCALARS or key in ("double", "float", "bytes"):
            raise self.error("map keys must be an integral type, bool or string", tok)
        self.expect(",")
        value = self.ident("a map value type")
        self.expect(">")
        name = self.simple_name("a field name")
        self.expect("=")
        number = self.integer("a field number")
        options = self.field_options()
        self.expect(";")
        message.map_entry_positions[name] = len(message.messages)
        return ProtoField(
            name, number, f"map<{key}, {value}>", None, None, key, value, options=options
        )

    def group(self, message: ProtoMessage, label: str | None, oneof: str | None) -> ProtoField:
        start = self.next()
        if self.file.syntax == "proto3":
            raise self.error("groups are not allowed in proto3", start)
        name = self.simple_name("a group name")
        if not name[0].isupper():
            raise self.error("group names must start with a capital letter")
        self.expect("=")
        number = self.integer("a field number")
        options = self.field_options()
        nested = ProtoMessage(name, f"{message.full_name}.{name}")
        self.expect("{")
        self.message_body(nested)
        self.check_message(nested)
        message.messages.append(nested)
        return ProtoField(name.lower(), number, name, label, oneof, group=True, options=options)

    def oneof(self, message: ProtoMessage) -> None:
        self.next()
        name = self.simple_name("a oneof name")
        message.oneofs.append(name)
        self.expect("{")
        while not self.accept("}"):
            if self.tok.kind == "eof":
                raise self.error(f"expected '}}' to close oneof '{name}'")
            if self.accept(";"):
                continue
            if self.tok.value == "option" and self.peek(1).value != "=":
                self.option_statement({})
                continue
            message.fields.append(self.field(message, name))

    def extend(self, scope: str, message: ProtoMessage) -> None:
        """Extensions are parsed for syntax but not kept: they live in another message."""
        self.expect("extend")
        self.ident("a message name")
        holder = ProtoMessage("", scope)
        self.expect("{")
        while not self.accept("}"):
            if self.tok.kind == "eof":
                raise self.error("expected '}' to close extend")
            if self.accept(";"):
                continue
            self.field(holder, None)
        message.messages.extend(holder.messages)  # groups declared inside extend

    def reserved(
        self, numbers: list[tuple[int, int]], names: list[str], top: int = MAX_FIELD_NUMBER
    ) -> None:
        self.next()
        if self.tok.kind in ("string", "ident"):  # editions spell reserved names as identifiers
            while True:
                names.append(self.string() if self.tok.kind == "string" else self.ident())
                if not self.accept(","):
                    break
        else:
            self.ranges(numbers, top)
        self.expect(";")

    def ranges(self, into: list[tuple[int, int]], top: int = MAX_FIELD_NUMBER) -> None:
        while True:
            low = self.integer("a number")
            high = low
            if self.accept("to"):
                high = top if self.accept("max") else self.integer("a number")
            if high < low:
                raise self.error(f"range {low} to {high} is empty")
            into.append((low, high))
            if not self.accept(","):
                break

    def check_message(self, message: ProtoMessage) -> None:
        numbers: dict[int, str] = {}
        names: set[str] = set()
        for fld in message.fields:
            where = f"field '{fld.name}' of message '{message.full_name}'"
            if not 1 <= fld.number <= MAX_FIELD_NUMBER:
                raise InvalidSchemaError(
                    f"Invalid Protobuf schema: {where}: number {fld.number} is out of range "
                    f"1..{MAX_FIELD_NUMBER}"
                )
            low, high = RESERVED_IMPLEMENTATION_RANGE
            if low <= fld.number <= high:
                raise InvalidSchemaError(
                    f"Invalid Protobuf schema: {where}: numbers {low}-{high} are reserved for "
                    "the protobuf implementation"
                )
            if fld.number in numbers:
                raise InvalidSchemaError(
                    f"Invalid Protobuf schema: {where}: number {fld.number} is already used by "
                    f"field '{numbers[fld.number]}'"
                )
            if fld.name in names:
                raise InvalidSchemaError(f"Invalid Protobuf schema: {where}: duplicate field name")
            if any(a <= fld.number <= b for a, b in message.reserved_numbers):
                raise InvalidSchemaError(
                    f"Invalid Protobuf schema: {where}: number {fld.number} is reserved"
                )
            if fld.name in message.reserved_names:
                raise InvalidSchemaError(f"Invalid Protobuf schema: {where}: name is reserved")
            numbers[fld.number] = fld.name
            names.add(fld.name)

    # -- enums and services -----------------------------------------------------------

    def enum(self, scope: str) -> ProtoEnum:
        self.expect("enum")
        name = self.simple_name("an enum name")
        enum = ProtoEnum(name, f"{scope}.{name}" if scope else name)
        self.expect("{")
        while not self.accept("}"):
            if self.tok.kind == "eof":
                raise self.error(f"expected '}}' to close enum '{name}'")
            if self.accept(";"):
                continue
            if self.tok.value == "option" and self.peek(1).value != "=":
                self.option_statement(enum.options)
            elif self.tok.value == "reserved" and "=" not in (
                self.peek(1).value,
                self.peek(2).value,
            ):
                self.reserved(enum.reserved_numbers, enum.reserved_names, 2**31 - 1)
            else:
                tok = self.tok
                value_name = self.simple_name("an enum value name")
                self.expect("=")
                number = self.integer("an enum value number")
                self.field_options()
                self.expect(";")
                if value_name in enum.values:
                    raise self.error(f"duplicate enum value '{value_name}'", tok)
                enum.values[value_name] = number
        self.check_enum(enum)
        return enum

    def check_enum(self, enum: ProtoEnum) -> None:
        prefix = f"Invalid Protobuf schema: enum '{enum.full_name}'"
        if not enum.values:
            raise InvalidSchemaError(f"{prefix} must have at least one value")
        if self.file.syntax == "proto3" and next(iter(enum.values.values())) != 0:
            raise InvalidSchemaError(f"{prefix}: the first value must be zero in proto3")
        if enum.options.get("allow_alias") != "true" and len(set(enum.values.values())) != len(
            enum.values
        ):
            raise InvalidSchemaError(
                f"{prefix}: values share a number; set option allow_alias = true to allow it"
            )

    def service(self) -> ProtoService:
        self.expect("service")
        service = ProtoService(self.simple_name("a service name"))
        self.expect("{")
        while not self.accept("}"):
            if self.tok.kind == "eof":
                raise self.error(f"expected '}}' to close service '{service.name}'")
            if self.accept(";"):
                continue
            if self.tok.value == "option":
                self.option_statement({})
                continue
            self.expect("rpc")
            method = ProtoMethod(self.simple_name("a method name"), "", "")
            self.expect("(")
            method.client_streaming = (
                self.tok.value == "stream" and self.peek(1).kind == "ident" and bool(self.next())
            )
            method.input_type = self.ident("a request type")
            self.expect(")")
            self.expect("returns")
            self.expect("(")
            method.server_streaming = (
                self.tok.value == "stream" and self.peek(1).kind == "ident" and bool(self.next())
            )
            method.output_type = self.ident("a response type")
            self.expect(")")
            if self.accept("{"):
                while not self.accept("}"):
                    if self.tok.kind == "eof":
                        raise self.error("expected '}' to close rpc")
                    if not self.accept(";"):
                        self.option_statement({})
            else:
                self.expect(";")
            service.methods.append(method)
        return service


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


def check_types(pf: ProtoFile) -> None:
    """Every field and method type must resolve, unless it may come from an unloaded import."""
    if not pf.fully_loaded:
        return
    table = pf.type_table()
    for message in pf.all_messages():
        for fld in message.fields:
            names = [fld.value_type or ""] if fld.is_map else [fld.type]
            for name in names:
                if name in SCALARS:
                    continue
                if resolve_type(name, message.full_name, table) is None:
                    raise InvalidSchemaError(
                        f"Invalid Protobuf schema: field '{fld.name}' of message "
                        f"'{message.full_name}' has unknown type '{name}'"
                    )
    for service in pf.services:
        for method in service.methods:
            for name in (method.input_type, method.output_type):
                found = resolve_type(name, pf.package, table)
                if found is None or not isinstance(table[found], ProtoMessage):
                    raise InvalidSchemaError(
                        f"Invalid Protobuf schema: method '{service.name}.{method.name}' uses "
                        f"unknown message type '{name}'"
                    )
