"""ACLs and the rules that decide a request with them, as Kafka's StandardAuthorizer does.

Pure: no I/O, no protocol. The ACL APIs (``acl_apis.py``) store bindings in the metadata store
and hand them here; every check is then dict lookups in memory.

The rules, Kafka's (``org.apache.kafka.metadata.authorizer.StandardAuthorizerData``):

* a super user (``super.users``, e.g. ``User:admin``) may do everything;
* the ACLs that apply to an action on (resource type, name) are the LITERAL ones on that name,
  the LITERAL ``*`` ones, and the PREFIXED ones whose name starts the resource's name; of those,
  the ones for the principal or ``User:*``, for the client's IP or ``*``;
* a DENY for the operation (or ALL) wins over any ALLOW; an ALLOW for the operation, for ALL,
  or one that implies it (READ, WRITE, DELETE, ALTER imply DESCRIBE; ALTER_CONFIGS implies
  DESCRIBE_CONFIGS; only ALLOW ACLs imply) allows;
* no ACL allows: denied, except that ``allow.everyone.if.no.acl.found`` allows when no ACL
  applies to the resource at all, for any principal, host or operation (the StandardAuthorizer's
  ``hasResourceAcls``: once a resource has an ACL, its ACLs are enforced whatever the setting,
  so ``ALLOW User:bob READ t`` keeps everyone else out of ``t``).

Describe/DeleteAcls filters match bindings as Kafka's ``AclBindingFilter.matches`` does,
including the pattern filters ANY (any pattern type, the name exactly) and MATCH (every
binding that would apply to the named resource: literal, ``*`` and prefixed).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeVar

CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
ANONYMOUS = "User:ANONYMOUS"
E = TypeVar("E", bound=IntEnum)
S = TypeVar("S", str, str | None)  # a binding's names are set; a filter's may be None

# authorizer.class.name values that select the built-in authorizer (Kafka's KRaft one, and the
# ZooKeeper-era one that older server.properties name).
AUTHORIZER_CLASSES = (
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
)


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    """Kafka's AclOperation; the codes are also the bits of the authorized-operations fields."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


Op = Operation
IMPLIES_DESCRIBE = frozenset({Op.DESCRIBE, Op.READ, Op.WRITE, Op.DELETE, Op.ALTER})
IMPLIES_DESCRIBE_CONFIGS = frozenset({Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS})

# The operations each resource type has (Kafka's AclEntry.supportedOperations): the bits an
# authorized-operations field may carry.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (
        Op.READ,
        Op.WRITE,
        Op.CREATE,
        Op.DESCRIBE,
        Op.DELETE,
        Op.ALTER,
        Op.DESCRIBE_CONFIGS,
        Op.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (Op.READ, Op.DESCRIBE, Op.DELETE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS),
    ResourceType.CLUSTER: (
        Op.CREATE,
        Op.CLUSTER_ACTION,
        Op.DESCRIBE_CONFIGS,
        Op.ALTER_CONFIGS,
        Op.IDEMPOTENT_WRITE,
        Op.ALTER,
        Op.DESCRIBE,
    ),
    ResourceType.TRANSACTIONAL_ID: (Op.DESCRIBE, Op.WRITE, Op.TWO_PHASE_COMMIT),
    ResourceType.DELEGATION_TOKEN: (Op.DESCRIBE,),
    ResourceType.USER: (Op.CREATE_TOKENS, Op.DESCRIBE_TOKENS),
}


class AclError(ValueError):
    """A binding or filter Kafka would refuse (INVALID_REQUEST), with Kafka's reason."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: who (principal, host) may or may not (permission) do what (operation) on
    which resources (type, name, pattern type)."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    @classmethod
    def of(
        cls,
        resource_type: int,
        resource_name: str,
        pattern_type: int,
        principal: str,
        host: str,
        operation: int,
        permission: int,
    ) -> AclBinding:
        """From the wire's codes; a code Kafka does not define is an AclError."""
        return cls(
            *_decoded(
                resource_type, resource_name, pattern_type, principal, host, operation, permission
            )
        )

    def validate(self) -> None:
        """AclError if Kafka's CreateAcls would refuse this binding (its messages)."""
        if self.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            raise AclError(f"Invalid resourceType {self.resource_type.name}")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise AclError(f"Invalid patternType {self.pattern_type.name}")
        if self.operation in (Op.UNKNOWN, Op.ANY):
            raise AclError(f"Invalid operation {self.operation.name}")
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            raise AclError(f"Invalid permissionType {self.permission.name}")
        if not self.resource_name:
            raise AclError("Invalid empty resource name")
        if self.resource_type == ResourceType.CLUSTER and self.resource_name != CLUSTER_NAME:
            raise AclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        kind, colon, name = self.principal.partition(":")
        if not colon or not kind or not name:
            raise AclError(
                f"Could not parse principal from `{self.principal}` (expected "
                "principalType:principalName, e.g. User:alice)"
            )
        if self.host != WILDCARD:
            try:
                ipaddress.ip_address(self.host)
            except ValueError:
                raise AclError(
                    f"Invalid host {self.host!r}: an ACL's host is * or an IP address "
                    "(the client's address is compared, never a host name)"
                ) from None


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Kafka's AclBindingFilter: None and ANY match anything (MATCH: see the module doc)."""

    resource_type: ResourceType
    resource_name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission

    @classmethod
    def of(
        cls,
        resource_type: int,
        resource_name: str | None,
        pattern_type: int,
        principal: str | None,
        host: str | None,
        operation: int,
        permission: int,
    ) -> AclFilter:
        made = cls(
            *_decoded(
                resource_type, resource_name, pattern_type, principal, host, operation, permission
            )
        )
        if made.pattern_type == PatternType.UNKNOWN or made.resource_type == ResourceType.UNKNOWN:
            raise AclError("Unknown patternFilter.")
        if made.operation == Op.UNKNOWN or made.permission == Permission.UNKNOWN:
            raise AclError("Unknown entryFilter.")
        return made

    def matches(self, acl: AclBinding) -> bool:
        return self._matches_pattern(acl) and self._matches_entry(acl)

    def _matches_pattern(self, acl: AclBinding) -> bool:
        if self.resource_type not in (ResourceType.ANY, acl.resource_type):
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH, acl.pattern_type):
            return False
        if self.resource_name is None:
            return True
        if self.pattern_type in (PatternType.ANY, acl.pattern_type):
            return self.resource_name == acl.resource_name
        # MATCH: the bindings that would apply to the resource named
        if acl.pattern_type == PatternType.LITERAL:
            return acl.resource_name in (self.resource_name, WILDCARD)
        return self.resource_name.startswith(acl.resource_name)

    def _matches_entry(self, acl: AclBinding) -> bool:
        if self.principal is not None and self.principal != acl.principal:
            return False
        if self.host is not None and self.host != acl.host:
            return False
        if self.operation not in (Op.ANY, acl.operation):
            return False
        return self.permission in (Permission.ANY, acl.permission)


def _decoded(
    resource_type: int,
    resource_name: S,
    pattern_type: int,
    principal: S,
    host: S,
    operation: int,
    permission: int,
) -> tuple[ResourceType, S, PatternType, S, S, Operation, Permission]:
    """A binding's or a filter's fields (same order) from the wire's codes; a code Kafka
    does not define is an AclError."""
    return (
        _enum(ResourceType, resource_type, "resource type"),
        resource_name,
        _enum(PatternType, pattern_type, "pattern type"),
        principal,
        host,
        _enum(Operation, operation, "operation"),
        _enum(Permission, permission, "permission type"),
    )


def _enum(kind: type[E], code: int, what: str) -> E:
    try:
        return kind(code)
    except ValueError:
        raise AclError(f"unknown {what} code {code}") from None


def parse_super_users(value: str) -> frozenset[str]:
    """``super.users``: principals separated by semicolons (``User:admin;User:broker``)."""
    users = frozenset(u.strip() for u in value.split(";") if u.strip())
    for user in users:
        kind, colon, name = user.partition(":")
        if not colon or not kind or not name:
            raise ValueError(
                f"super.users entries are principalType:name separated by ';', got {user!r}"
            )
    return users


class Authorizer:
    """The ACLs in memory, indexed so a decision is a few dict lookups: LITERAL bindings by
    (type, name), PREFIXED ones by (type, prefix) with the prefix lengths present per type."""

    def __init__(
        self,
        super_users: Iterable[str] = (),
        allow_if_no_acl: bool = False,
        acls: Iterable[AclBinding] = (),
    ) -> None:
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self._acls: set[AclBinding] = set()
        self._literal: dict[tuple[ResourceType, str], set[AclBinding]] = {}
        self._prefixed: dict[tuple[ResourceType, str], set[AclBinding]] = {}
        self._prefix_lengths: dict[ResourceType, dict[int, int]] = {}
        for acl in acls:
            self.add(acl)

    # ---- the ACL set

    def acls(self, where: AclFilter | None = None) -> list[AclBinding]:
        return [a for a in self._acls if where is None or where.matches(a)]

    def add(self, acl: AclBinding) -> bool:
        """False if it was there already (creating it twice is no error, as in Kafka)."""
        if acl in self._acls:
            return False
        self._acls.add(acl)
        if acl.pattern_type == PatternType.LITERAL:
            self._literal.setdefault((acl.resource_type, acl.resource_name), set()).add(acl)
        else:
            self._prefixed.setdefault((acl.resource_type, acl.resource_name), set()).add(acl)
            lengths = self._prefix_lengths.setdefault(acl.resource_type, {})
            lengths[len(acl.resource_name)] = lengths.get(len(acl.resource_name), 0) + 1
        return True

    def remove(self, acl: AclBinding) -> None:
        if acl not in self._acls:
            return
        self._acls.discard(acl)
        index = self._literal if acl.pattern_type == PatternType.LITERAL else self._prefixed
        key = (acl.resource_type, acl.resource_name)
        index[key].discard(acl)
        if not index[key]:
            del index[key]
        if acl.pattern_type == PatternType.PREFIXED:
            lengths = self._prefix_lengths[acl.resource_type]
            lengths[len(acl.resource_name)] -= 1
            if not lengths[len(acl.resource_name)]:
                del lengths[len(acl.resource_name)]

    # ---- decisions

    def _applicable(self, resource_type: ResourceType, name: str) -> Iterable[AclBinding]:
        yield from self._literal.get((resource_type, name), ())
        if name != WILDCARD:
            yield from self._literal.get((resource_type, WILDCARD), ())
        for length in self._prefix_lengths.get(resource_type, {}):
            if length <= len(name):
                yield from self._prefixed.get((resource_type, name[:length]), ())

    def authorize(
        self,
        principal: str,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        """May ``principal`` connected from ``host`` (an IP, no slash) do ``operation`` on the
        resource?"""
        if principal in self.super_users:
            return True
        allowed = has_acls = False
        for acl in self._applicable(resource_type, name):
            has_acls = True
            result = _result(acl, principal, host, operation)
            if result is Permission.DENY:
                return False
            if result is Permission.ALLOW:
                allowed = True
        return allowed or (self.allow_if_no_acl and not has_acls)

    def authorize_literal(
        self,
        principal: str,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        """``authorize``, stricter for a sensitive resource: besides a super user, only an ALLOW
        on this very name counts (not a ``*`` or prefixed one, not allow.everyone.if.no.acl.found);
        any DENY that applies still refuses."""
        if principal in self.super_users:
            return True
        if not self.authorize(principal, host, operation, resource_type, name):
            return False
        return any(
            _result(acl, principal, host, operation) is Permission.ALLOW
            for acl in self._literal.get((resource_type, name), ())
        )

    def authorized_operations(
        self, principal: str, host: str, resource_type: ResourceType, name: str
    ) -> int:
        """The authorized-operations bitfield (KIP-430): bit ``op`` set for each operation of
        the resource type the principal may do."""
        bits = 0
        for op in SUPPORTED_OPERATIONS[resource_type]:
            if self.authorize(principal, host, op, resource_type, name):
                bits |= 1 << op
        return bits

    def authorize_any(
        self, principal: str, host: str, operation: Operation, resource_type: ResourceType
    ) -> bool:
        """Kafka's ``authorizeByResourceType`` (KIP-679): may the principal do ``operation`` on
        at least one resource of the type? (Allowed on some literal or prefixed name that no
        DENY covers.) InitProducerId asks it for WRITE on any topic, which implies
        IDEMPOTENT_WRITE since Kafka 3.0."""
        if self.authorize(principal, host, operation, resource_type, "hardcode"):
            return True  # a super user, allow.everyone.if.no.acl.found, or a wildcard allow
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allows: list[AclBinding] = []
        for acl in self._acls:
            if acl.resource_type != resource_type:
                continue
            if acl.host not in (WILDCARD, host) or acl.principal not in (
                principal,
                WILDCARD_PRINCIPAL,
            ):
                continue
            if acl.operation not in (operation, Op.ALL):
                continue
            if acl.permission == Permission.DENY:
                if acl.pattern_type == PatternType.LITERAL:
                    if acl.resource_name == WILDCARD:
                        return False
                    deny_literal.add(acl.resource_name)
                else:
                    deny_prefixed.add(acl.resource_name)
            else:
                if acl.pattern_type == PatternType.LITERAL and acl.resource_name == WILDCARD:
                    return True
                allows.append(acl)
        for acl in allows:
            if acl.pattern_type == PatternType.LITERAL and acl.resource_name in deny_literal:
                continue
            name = acl.resource_name
            if not any(name[:i] in deny_prefixed for i in range(1, len(name) + 1)):
                return True
        return False


def _result(acl: AclBinding, principal: str, host: str, operation: Operation) -> Permission | None:
    """What one applicable ACL says about the action (None: nothing)."""
    if acl.principal not in (principal, WILDCARD_PRINCIPAL):
        return None
    if acl.host not in (WILDCARD, host):
        return None
    if acl.operation != Op.ALL:
        if acl.permission == Permission.ALLOW:
            if operation == Op.DESCRIBE:
                if acl.operation not in IMPLIES_DESCRIBE:
                    return None
            elif operation == Op.DESCRIBE_CONFIGS:
                if acl.operation not in IMPLIES_DESCRIBE_CONFIGS:
                    return None
            elif operation != acl.operation:
                return None
        elif operation != acl.operation:
            return None
    return acl.permission
