"""The result type every format-specific checker returns.

Each checker compares one *reader* schema with one *writer* schema and knows nothing
about compatibility levels; `compat.py` decides which of the two is the new schema.
Descriptions therefore use the placeholders ``{reader}`` and ``{writer}``, which
`render` replaces with "new schema" / "old schema" once the direction is known, so
that a message reads the same way Confluent's do ("... in the new schema ... missing
in the old schema").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Incompatibility:
    """One reason why data written with `writer` cannot be read with `reader`.

    kind: a Confluent-style error type, e.g. "READER_FIELD_MISSING_DEFAULT_VALUE".
    path: where in the schema the problem is ("/fields/2", "#/properties/x", "Msg.3").
    description: human text with {reader}/{writer} placeholders.
    """

    kind: str
    path: str
    description: str

    def render(self, reader: str, writer: str) -> str:
        """The message with the placeholders replaced, e.g. reader="the new schema"."""
        text = self.description.replace("{reader}", reader).replace("{writer}", writer)
        return f"{self.kind} at {self.path or '/'}: {text}"
