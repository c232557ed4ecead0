"""Errors shared by the schema registry modules.

Kept in a module of its own so the REST layer can map them to HTTP status codes
(Confluent answers 422 / error_code 42201 for an invalid schema) without importing
any of the format-specific checkers.
"""

from __future__ import annotations


class InvalidSchemaError(ValueError):
    """A schema string that does not parse or is not a valid schema of its type.

    The message says what is wrong and where, because it is returned verbatim to the
    client that tried to register the schema.
    """
