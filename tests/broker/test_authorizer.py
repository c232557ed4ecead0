"""The authorizer's rules (broker/kafka/authorizer.py), pure and fast: Kafka's
StandardAuthorizer semantics, AclBindingFilter matching, Kafka's CreateAcls refusals, and the
three config keys that turn it on."""

from __future__ import annotations

import pytest

from broker.config import ConfigError, load_broker_config
from broker.kafka.authorizer import (
    AclBinding,
    AclError,
    AclFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

Op, RT, PT = Operation, ResourceType, PatternType
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.5"


def binding(
    name: str,
    op: Operation,
    permission: Permission = Permission.ALLOW,
    pattern: PatternType = PT.LITERAL,
    principal: str = ALICE,
    host: str = "*",
    resource: ResourceType = RT.TOPIC,
) -> AclBinding:
    return AclBinding(resource, name, pattern, principal, host, op, permission)


def may(a: Authorizer, op: Operation, name: str, principal: str = ALICE, host: str = HOST) -> bool:
    return a.authorize(principal, host, op, RT.TOPIC, name)


def test_literal_prefixed_and_wildcard_resources() -> None:
    a = Authorizer(
        acls=[
            binding("orders", Op.READ),
            binding("pay-", Op.WRITE, pattern=PT.PREFIXED),
            binding("*", Op.DESCRIBE, principal=BOB),
        ]
    )
    assert may(a, Op.READ, "orders") and not may(a, Op.READ, "orders2")
    assert may(a, Op.WRITE, "pay-eu") and may(a, Op.WRITE, "pay-") and not may(a, Op.WRITE, "pa")
    assert not may(a, Op.WRITE, "orders")
    assert may(a, Op.DESCRIBE, "anything", BOB) and not may(a, Op.READ, "anything", BOB)
    # a prefixed ACL named "*" is a prefix, not the wildcard
    b = Authorizer(acls=[binding("*", Op.READ, pattern=PT.PREFIXED)])
    assert may(b, Op.READ, "*x") and not may(b, Op.READ, "orders")


def test_implied_operations_only_from_allow_and_deny_beats_allow() -> None:
    a = Authorizer(
        acls=[
            binding("t", Op.WRITE),
            binding("t", Op.ALTER_CONFIGS),
            binding("t", Op.READ, Permission.DENY),
            binding("u", Op.ALL),
            binding("u", Op.DELETE, Permission.DENY, pattern=PT.PREFIXED),
        ]
    )
    assert may(a, Op.DESCRIBE, "t")  # WRITE implies DESCRIBE
    assert may(a, Op.DESCRIBE_CONFIGS, "t")  # ALTER_CONFIGS implies DESCRIBE_CONFIGS
    assert not may(a, Op.READ, "t")  # DENY READ ...
    assert not may(a, Op.ALTER, "t")
    assert may(a, Op.READ, "u") and not may(a, Op.DELETE, "u")  # ALL, but a prefixed DENY wins
    # a DENY of READ does not deny DESCRIBE; a DENY of ALL denies everything
    b = Authorizer(acls=[binding("t", Op.DESCRIBE), binding("t", Op.READ, Permission.DENY)])
    assert may(b, Op.DESCRIBE, "t")
    c = Authorizer(acls=[binding("t", Op.WRITE), binding("t", Op.ALL, Permission.DENY)])
    assert not may(c, Op.DESCRIBE, "t") and not may(c, Op.WRITE, "t")


def test_principal_and_host_wildcards_super_users_and_the_default() -> None:
    a = Authorizer(
        super_users={"User:admin"},
        acls=[
            binding("t", Op.READ, principal="User:*"),
            binding("h", Op.READ, host="10.0.0.9"),
            binding("d", Op.READ, Permission.DENY, principal="User:*"),
        ],
    )
    assert may(a, Op.READ, "t", BOB) and may(a, Op.READ, "t", "User:ANONYMOUS")
    assert not may(a, Op.READ, "h") and may(a, Op.READ, "h", host="10.0.0.9")
    assert may(a, Op.READ, "d", "User:admin") and may(a, Op.DELETE, "none", "User:admin")
    assert not may(a, Op.READ, "d") and not may(a, Op.READ, "none")
    # allow.everyone.if.no.acl.found: only a resource without any ACL (StandardAuthorizer's
    # hasResourceAcls); once it has one, for anyone, its ACLs are enforced
    b = Authorizer(allow_if_no_acl=True, acls=[binding("t", Op.READ, principal=BOB)])
    assert may(b, Op.READ, "t", BOB) and not may(b, Op.READ, "t") and not may(b, Op.WRITE, "t", BOB)
    assert may(b, Op.READ, "other") and may(b, Op.WRITE, "other", BOB)
    c = Authorizer(allow_if_no_acl=True, acls=[binding("t", Op.READ, Permission.DENY)])
    assert not may(c, Op.READ, "t") and not may(c, Op.WRITE, "t")
    d = Authorizer(allow_if_no_acl=True, acls=[binding("pay-", Op.READ, pattern=PT.PREFIXED)])
    assert not may(d, Op.WRITE, "pay-eu") and may(d, Op.WRITE, "other")


def test_authorized_operations_bits_and_authorize_any() -> None:
    a = Authorizer(acls=[binding("t", Op.WRITE), binding("t", Op.ALTER_CONFIGS)])
    bits = a.authorized_operations(ALICE, HOST, RT.TOPIC, "t")
    expected = {Op.WRITE, Op.DESCRIBE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS}
    assert bits == sum(1 << op for op in expected)
    # WRITE on some topic (KIP-679), unless a DENY covers it
    assert a.authorize_any(ALICE, HOST, Op.WRITE, RT.TOPIC)
    assert not a.authorize_any(BOB, HOST, Op.WRITE, RT.TOPIC)
    b = Authorizer(
        acls=[
            binding("pay-eu", Op.WRITE),
            binding("pay-", Op.WRITE, Permission.DENY, pattern=PT.PREFIXED),
        ]
    )
    assert not b.authorize_any(ALICE, HOST, Op.WRITE, RT.TOPIC)
    b.add(binding("other", Op.ALL))
    assert b.authorize_any(ALICE, HOST, Op.WRITE, RT.TOPIC)
    b.add(binding("*", Op.WRITE, Permission.DENY))
    assert not b.authorize_any(ALICE, HOST, Op.WRITE, RT.TOPIC)


def test_add_and_remove_keep_the_index() -> None:
    a = Authorizer()
    acl = binding("pay-", Op.READ, pattern=PT.PREFIXED)
    assert a.add(acl) and not a.add(acl)
    assert may(a, Op.READ, "pay-x")
    a.remove(acl)
    a.remove(acl)
    assert not may(a, Op.READ, "pay-x") and a.acls() == []


def test_filters_match_as_kafkas_acl_binding_filter() -> None:
    literal = binding("foo", Op.READ)
    wildcard = binding("*", Op.READ)
    prefixed = binding("fo", Op.READ, pattern=PT.PREFIXED)
    other = binding("bar", Op.WRITE, Permission.DENY, principal=BOB, host=HOST)
    group = binding("foo", Op.READ, resource=RT.GROUP)
    acls = [literal, wildcard, prefixed, other, group]

    def matched(
        name: str | None,
        pattern: PatternType,
        resource: ResourceType = RT.TOPIC,
        principal: str | None = None,
        host: str | None = None,
        op: Operation = Op.ANY,
        permission: Permission = Permission.ANY,
    ) -> list[AclBinding]:
        f = AclFilter(resource, name, pattern, principal, host, op, permission)
        return [b for b in acls if f.matches(b)]

    assert matched("foo", PT.LITERAL) == [literal]
    assert matched("foo", PT.ANY) == [literal]
    assert matched("foo", PT.MATCH) == [literal, wildcard, prefixed]
    assert matched("fo", PT.PREFIXED) == [prefixed]
    assert matched(None, PT.ANY, RT.ANY) == acls
    assert matched(None, PT.ANY, RT.GROUP) == [group]
    assert matched(None, PT.ANY, principal=BOB) == [other]
    assert matched(None, PT.ANY, host=HOST) == [other]
    assert matched(None, PT.ANY, op=Op.WRITE) == [other]
    assert matched(None, PT.ANY, permission=Permission.DENY) == [other]
    with pytest.raises(AclError, match="Unknown patternFilter"):
        AclFilter.of(2, None, 0, None, None, 1, 1)
    with pytest.raises(AclError, match="unknown operation code 99"):
        AclFilter.of(2, None, 1, None, None, 99, 1)


@pytest.mark.parametrize(
    ("acl", "reason"),
    [
        (AclBinding.of(1, "t", 3, ALICE, "*", 3, 3), "Invalid resourceType ANY"),
        (AclBinding.of(2, "t", 2, ALICE, "*", 3, 3), "Invalid patternType MATCH"),
        (AclBinding.of(2, "t", 3, ALICE, "*", 1, 3), "Invalid operation ANY"),
        (AclBinding.of(2, "t", 3, ALICE, "*", 3, 1), "Invalid permissionType ANY"),
        (AclBinding.of(2, "", 3, ALICE, "*", 3, 3), "Invalid empty resource name"),
        (AclBinding.of(4, "c", 3, ALICE, "*", 7, 3), "only valid name for the CLUSTER"),
        (AclBinding.of(2, "t", 3, "alice", "*", 3, 3), "Could not parse principal"),
        (AclBinding.of(2, "t", 3, ALICE, "example.com", 3, 3), "Invalid host"),
    ],
)
def test_create_acls_refuses_what_kafka_refuses(acl: AclBinding, reason: str) -> None:
    with pytest.raises(AclError, match=reason):
        acl.validate()


def test_config_keys_turn_it_on_and_refuse_what_they_do_not_know() -> None:
    config = load_broker_config(
        overrides={
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": "User:admin; User:broker",
            "allow.everyone.if.no.acl.found": "true",
        }
    )
    assert config.authorizer_class_name == "kafka.security.authorizer.AclAuthorizer"
    assert config.allow_everyone_if_no_acl_found
    assert load_broker_config().authorizer_class_name == ""
    with pytest.raises(ConfigError, match=r"authorizer.class.name: .*unknown authorizer 'my.Own'"):
        load_broker_config(overrides={"authorizer.class.name": "my.Own"})
    with pytest.raises(ConfigError, match=r"super.users: .*got 'admin'"):
        load_broker_config(overrides={"super.users": "User:root;admin"})


def test_every_request_refused_as_a_whole_has_an_error_response() -> None:
    """The dispatch refuses REQUEST_CHECKS' APIs with ``Responder.error``: it must build and
    encode an answer, carrying the code where the version has a top-level error, for every
    version served."""
    from broker.kafka.acl_apis import REQUEST_CHECKS
    from broker.kafka.codec import Responder, encode_response
    from broker.kafka.handlers import SUPPORTED_VERSIONS

    served = [key for key in REQUEST_CHECKS if key in SUPPORTED_VERSIONS]
    assert served, "no API refused as a whole is served"
    for key in served:
        low, high = SUPPORTED_VERSIONS[key]
        for version in range(low, high + 1):
            answer = Responder(key, version).error(30, "Not authorized to access group: g")
            assert encode_response(7, answer)[:4]  # encodes
            if hasattr(answer, "error_code"):
                assert int(answer.error_code) == 30, (key, version)
