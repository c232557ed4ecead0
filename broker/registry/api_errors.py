"""The errors the registry's REST API answers, with Confluent's HTTP statuses,
error codes and message texts (io.confluent.kafka.schemaregistry.rest.exceptions.Errors).

Every failure the store or the API detects is raised as a RegistryError; the API
turns it into ``{"error_code": ..., "message": ...}`` with the status.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.registry.schemas import Reference

COMPATIBILITY_LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
MODES = ("READWRITE", "READONLY", "READONLY_OVERRIDE", "IMPORT")


class RegistryError(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def body(self) -> dict[str, object]:
        return {"error_code": self.code, "message": self.message}


# ------------------------------------------------------------------ 400 / 422 request shape


def bad_request(message: str) -> RegistryError:
    """A body that is not JSON at all (rest-utils' JsonParseExceptionMapper: 400 / 400)."""
    return RegistryError(400, 400, message)


def unprocessable(message: str) -> RegistryError:
    """A JSON body of the wrong shape (a field of the wrong type, not an object)."""
    return RegistryError(422, 422, message)


# ------------------------------------------------------------------ 404


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(version: int | str) -> RegistryError:
    return RegistryError(404, 40402, f"Version {version} not found.")


def schema_not_found(schema_id: int | None = None) -> RegistryError:
    return RegistryError(
        404, 40403, "Schema not found" if schema_id is None else f"Schema {schema_id} not found"
    )


def subject_soft_deleted(subject: str) -> RegistryError:
    return RegistryError(
        404, 40404, f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently"
    )


def subject_not_soft_deleted(subject: str) -> RegistryError:
    return RegistryError(
        404, 40405, f"Subject '{subject}' was not deleted first before being permanently deleted"
    )


def version_soft_deleted(subject: str, version: int | str) -> RegistryError:
    return RegistryError(
        404,
        40406,
        f"Subject '{subject}' Version {version} was soft deleted."
        "Set permanent=true to delete permanently",
    )


def version_not_soft_deleted(subject: str, version: int | str) -> RegistryError:
    return RegistryError(
        404,
        40407,
        f"Subject '{subject}' Version {version} was not deleted "
        "first before being permanently deleted",
    )


def compatibility_not_configured(subject: str) -> RegistryError:
    return RegistryError(
        404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured"
    )


def mode_not_configured(subject: str) -> RegistryError:
    return RegistryError(
        404, 40409, f"Subject '{subject}' does not have subject-level mode configured"
    )


def not_found(message: str = "HTTP 404 Not Found") -> RegistryError:
    return RegistryError(404, 404, message)


# ------------------------------------------------------------------ 409


def incompatible(message: str) -> RegistryError:
    return RegistryError(409, 409, message)


# ------------------------------------------------------------------ 422


def invalid_schema(message: str) -> RegistryError:
    return RegistryError(422, 42201, message)


def invalid_schema_of(
    subject: str | None, schema_type: str, schema: object, refs: Sequence[Reference], detail: str
) -> RegistryError:
    """A schema that does not parse, worded as Confluent's KafkaSchemaRegistry.parseSchema
    words it (``Invalid schema {subject=...,schema=...} with refs [...] of type T, details: ...``),
    so that tools matching on its start keep working; the details say what is wrong."""
    ref_text = (
        "["
        + ", ".join(
            f"{{name='{r.name}', subject='{r.subject}', version={r.version}}}" for r in refs
        )
        + "]"
    )
    described = (
        f"{{subject={subject},version=0,id=-1,schemaType={schema_type},references={ref_text},"
        f"metadata=null,ruleSet=null,schema={schema}}}"
    )
    detail = detail.removeprefix("Invalid schema: ")
    return RegistryError(
        422,
        42201,
        f"Invalid schema {described} with refs {ref_text} of type {schema_type}, details: {detail}",
    )


def invalid_version(version: str) -> RegistryError:
    return RegistryError(
        422,
        42202,
        f"The specified version '{version}' is not a valid version id. "
        'Allowed values are between [1, 2^31-1] and the string "latest"',
    )


def invalid_compatibility_level(level: object) -> RegistryError:
    return RegistryError(
        422,
        42203,
        "Invalid compatibility level. Valid values are none, backward, forward, full, "
        "backward_transitive, forward_transitive, and full_transitive",
    )


def invalid_mode(mode: object) -> RegistryError:
    return RegistryError(
        422, 42204, "Invalid mode. Valid values are READWRITE, READONLY, READONLY_OVERRIDE, IMPORT"
    )


def not_permitted(message: str) -> RegistryError:
    return RegistryError(422, 42205, message)


def reference_exists(message: str) -> RegistryError:
    return RegistryError(422, 42206, message)


def id_does_not_match(message: str) -> RegistryError:
    return RegistryError(422, 42207, message)


def invalid_subject(subject: str) -> RegistryError:
    return RegistryError(422, 42208, f"The specified subject '{subject}' is not valid.")


# ------------------------------------------------------------------ 500


def store_error(message: str) -> RegistryError:
    return RegistryError(500, 50001, message)
