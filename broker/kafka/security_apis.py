"""The security APIs of the Kafka listener: SaslHandshake and SaslAuthenticate (the exchange
itself is the connection's ``SaslSession``, broker/security/sasl.py), and
Describe/AlterUserScramCredentials, which manage the SCRAM credentials in the metadata store
as Kafka's KRaft controller does (one result per user; a user's changes all or nothing).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from broker.kafka.codec import Responder
from broker.security import scram
from broker.storage.metadata import MetadataStore

log = logging.getLogger(__name__)


class CloseAfterResponse(Exception):
    """Send ``response``, then close the connection (a failed authentication, as Kafka does)."""

    def __init__(self, response: Any) -> None:
        super().__init__("closing after the response")
        self.response = response


class SecurityApis:
    def _metadata_store(self) -> MetadataStore:
        raise NotImplementedError

    async def sasl_handshake(self, ctx: Any, req: Any, R: Responder) -> Any:
        outcome = ctx.sasl.handshake(req.mechanism, R) if ctx.sasl is not None else None
        if outcome is None:
            # a PLAINTEXT/SSL listener, or an authenticated connection that may not re-authenticate
            return R(error_code=ErrorCode.illegal_sasl_state, mechanisms=[])
        response, close = outcome
        if close:
            raise CloseAfterResponse(response)
        return response

    async def sasl_authenticate(self, ctx: Any, req: Any, R: Responder) -> Any:
        outcome = None
        if ctx.sasl is not None:
            token = bytes(req.auth_bytes)
            await ctx.sasl.look_up_credential(token)  # the store is read off the event loop
            outcome = ctx.sasl.authenticate(token, R)
        if outcome is None:
            return R(
                error_code=ErrorCode.illegal_sasl_state,
                error_message="SaslAuthenticate request received after successful authentication",
                auth_bytes=b"",
                session_lifetime=0,
            )
        response, close = outcome
        if close:
            raise CloseAfterResponse(response)
        if ctx.sasl.principal is not None and ctx.sasl.state == "complete":
            ctx.principal = ctx.sasl.principal
        return response

    async def describe_user_scram_credentials(self, ctx: Any, req: Any, R: Responder) -> Any:
        known = await asyncio.to_thread(self._metadata_store().scram_users)
        wanted = [u.name for u in req.users] if req.users else sorted(known)
        results = []
        for name in dict.fromkeys(wanted):
            if wanted.count(name) > 1:
                results.append(
                    _user_result(
                        name,
                        ErrorCode.duplicate_resource,
                        f"Cannot describe SCRAM credentials for the same user twice in a single request: {name}",
                    )
                )
            elif name not in known:
                results.append(
                    _user_result(
                        name,
                        ErrorCode.resource_not_found,
                        f"Attempt to describe a user credential that does not exist: {name}",
                    )
                )
            else:
                infos = [
                    {"mechanism": scram.IDS_BY_NAME[m], "iterations": i}
                    for m, i in sorted(known[name].items())
                ]
                results.append(
                    {**_user_result(name, ErrorCode.none, None), "credential_infos": infos}
                )
        return R(error_code=ErrorCode.none, error_message=None, results=results)

    async def alter_user_scram_credentials(self, ctx: Any, req: Any, R: Responder) -> Any:
        store = self._metadata_store()
        existing = await asyncio.to_thread(store.scram_users)
        changes: dict[str, list[tuple[str, Any]]] = {}
        for deletion in req.deletions:
            changes.setdefault(deletion.name, []).append(("delete", deletion))
        for upsertion in req.upsertions:
            changes.setdefault(upsertion.name, []).append(("upsert", upsertion))
        results = []
        for user, ops in changes.items():
            problem = _problem(user, ops, existing.get(user, {}))
            if problem is not None:
                results.append(
                    {"user": user, "error_code": problem[0], "error_message": problem[1]}
                )
                continue
            deletions = [
                (user, scram.MECHANISM_IDS[op.mechanism]) for kind, op in ops if kind == "delete"
            ]
            upsertions = []
            for kind, op in ops:
                if kind != "upsert":
                    continue
                mechanism = scram.MECHANISM_IDS[op.mechanism]
                credential = scram.from_salted_password(
                    mechanism, bytes(op.salt), bytes(op.salted_password), int(op.iterations)
                )
                upsertions.append(credential.row(user, mechanism))
            await asyncio.to_thread(store.alter_scram_credentials, deletions, upsertions)
            log.info(
                "SCRAM credentials of user %r: %s (by %s)",
                user,
                ", ".join(f"{kind} {scram.MECHANISM_IDS.get(op.mechanism)}" for kind, op in ops),
                ctx.principal,
            )
            results.append({"user": user, "error_code": ErrorCode.none, "error_message": None})
        return R(results=results)


def _user_result(name: str, code: int, message: str | None) -> dict[str, Any]:
    return {"user": name, "error_code": code, "error_message": message, "credential_infos": []}


def _problem(user: str, ops: list[tuple[str, Any]], has: dict[str, int]) -> tuple[int, str] | None:
    """Kafka's checks of one user's changes, in its order: (error code, message) or None."""
    if not user:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    seen: set[int] = set()
    for kind, op in ops:
        mechanism = scram.MECHANISM_IDS.get(op.mechanism)
        if mechanism is None:
            return ErrorCode.unsupported_sasl_mechanism, f"Unknown SCRAM mechanism {op.mechanism}"
        if op.mechanism in seen:
            return (
                ErrorCode.duplicate_resource,
                f"A user credential cannot be altered twice in the same request: {user} {mechanism}",
            )
        seen.add(op.mechanism)
        if kind == "delete" and mechanism not in has:
            return (
                ErrorCode.resource_not_found,
                f"Attempt to delete a user credential that does not exist: {user} {mechanism}",
            )
        if kind == "upsert":
            why = scram.credential_problem(user, mechanism, int(op.iterations), bytes(op.salt))
            if why is not None:
                return ErrorCode.unacceptable_credential, why
            if not op.salted_password:
                return ErrorCode.unacceptable_credential, "Salted password must not be empty"
    return None
