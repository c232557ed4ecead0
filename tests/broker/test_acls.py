"""ACLs end to end with real clients: Kafka's kafka-acls tool, confluent-kafka's admin API,
producers and consumers (confluent-kafka, kafka-python) refused with Kafka's error codes.

Plaintext connections are ``User:ANONYMOUS``, so the tests grant and refuse that principal.
One broker home for the module, restarted with other settings along the way (the tests run
in order): first with ``User:ANONYMOUS`` a super user, to create the first ACLs (as an admin
would); then with no super user (the ACLs survive the restart); then with
``allow.everyone.if.no.acl.found``; last with no authorizer at all."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from tests.broker import rawkafka
from tests.kafka_tools import kafka_tool
from tests.support import BrokerProcess, present, wait_for

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ME = "User:ANONYMOUS"
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
LITERAL, PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED


class AclBroker:
    """The module's broker home; ``start`` (re)starts it with other settings."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.process: BrokerProcess | None = None

    def start(self, **overrides: str) -> BrokerProcess:
        self.stop()
        args = ["--segment-flush-ms", "200"]
        for key, value in overrides.items():
            args += ["--override", f"{key.replace('_', '.')}={value}"]
        self.process = BrokerProcess(self.home, args).start()
        return self.process

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    @property
    def bootstrap(self) -> str:
        return present(self.process).bootstrap

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap})


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclBroker]:
    broker = AclBroker(tmp_path_factory.mktemp("acls") / "home")
    try:
        yield broker
    finally:
        broker.stop()


def acl(
    resource: ResourceType,
    name: str,
    operation: AclOperation,
    permission: AclPermissionType = ALLOW,
    pattern: ResourcePatternType = LITERAL,
    principal: str = ME,
    host: str = "*",
) -> AclBinding:
    return AclBinding(resource, name, pattern, principal, host, operation, permission)


def where(
    name: str | None = None,
    pattern: ResourcePatternType = ResourcePatternType.ANY,
    resource: ResourceType = ResourceType.ANY,
    principal: str | None = None,
    host: str | None = None,
) -> AclBindingFilter:
    """A DescribeAcls/DeleteAcls filter (any operation and permission)."""
    return AclBindingFilter(
        resource,
        name,  # type: ignore[arg-type]  # None: any (confluent-kafka's stubs say str)
        pattern,
        principal,  # type: ignore[arg-type]
        host,  # type: ignore[arg-type]
        AclOperation.ANY,
        AclPermissionType.ANY,
    )


def create_acls(admin: AdminClient, *bindings: AclBinding) -> None:
    for future in admin.create_acls(list(bindings)).values():
        future.result(10)


def described(admin: AdminClient, where: AclBindingFilter) -> set[tuple[Any, ...]]:
    return {key(b) for b in admin.describe_acls(where).result(10)}


def key(b: AclBinding) -> tuple[Any, ...]:
    return (
        b.restype,
        b.name,
        b.resource_pattern_type,
        b.principal,
        b.host,
        b.operation,
        b.permission_type,
    )


def error_of(future: Any) -> int:
    with pytest.raises(KafkaException) as caught:
        future.result(10)
    return int(caught.value.args[0].code())


def produce(bootstrap: str, topic: str, **conf: Any) -> KafkaError | None:
    """One record; the delivery report's error (None: delivered)."""
    reports: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 10000, **conf})
    producer.produce(topic, b"v", callback=lambda err, _msg: reports.append(err))
    producer.flush(15)
    assert len(reports) == 1, "no delivery report"
    return reports[0]


def assert_schemas_guarded(broker: BrokerProcess, admin: AdminClient) -> None:
    """Produce, DeleteRecords and DeleteTopics on _schemas: INVALID_TOPIC_EXCEPTION, as Kafka
    answers appends to its internal topics."""
    import json
    import urllib.request

    from broker.kafka.records import encode_batch

    register = urllib.request.Request(  # creates _schemas, if not there yet
        broker.registry_url + "/subjects/guard-value/versions",
        data=json.dumps({"schema": '"string"'}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(register, timeout=10) as answer:
        assert answer.status == 200
    bootstrap = broker.bootstrap
    batch = encode_batch([(b'{"keytype":"NOOP","magic":0}', None)], 0)
    assert rawkafka.produce_raw(bootstrap, "_schemas", 0, batch)[0] == KafkaError.TOPIC_EXCEPTION
    code = error_of(admin.delete_topics(["_schemas"])["_schemas"])
    assert code == KafkaError.TOPIC_EXCEPTION
    deleted = admin.delete_records([TopicPartition("_schemas", 0, 0)])
    assert error_of(deleted[TopicPartition("_schemas", 0, 0)]) == KafkaError.TOPIC_EXCEPTION


def test_kafka_acls_tool_adds_lists_and_removes_and_a_super_user_bypasses_acls(
    acl_broker: AclBroker,
) -> None:
    acl_broker.start(authorizer_class_name=STANDARD, super_users=f"User:admin;{ME}")
    b = ["--bootstrap-server", acl_broker.bootstrap]
    admin = acl_broker.admin()
    # a super user needs no ACL, and a DENY does not stop it
    for future in admin.create_topics([NewTopic("secret", 1)]).values():
        future.result(10)
    create_acls(admin, acl(ResourceType.TOPIC, "secret", AclOperation.WRITE, DENY))
    assert produce(acl_broker.bootstrap, "secret") is None
    kafka_tool(
        "kafka-acls", *b, "--add", "--allow-principal", ME, "--operation", "Alter",
        "--operation", "Describe", "--cluster",
    )  # fmt: skip
    alice = acl(
        ResourceType.TOPIC, "orders-", AclOperation.READ, ALLOW, PREFIXED, "User:alice", "10.1.2.3"
    )
    create_acls(admin, alice)
    listed = kafka_tool("kafka-acls", *b, "--list").stdout
    assert (
        "ResourcePattern(resourceType=CLUSTER, name=kafka-cluster, patternType=LITERAL)" in listed
    )
    assert "(principal=User:ANONYMOUS, host=*, operation=ALTER, permissionType=ALLOW)" in listed
    assert "(principal=User:ANONYMOUS, host=*, operation=DESCRIBE, permissionType=ALLOW)" in listed
    assert "ResourcePattern(resourceType=TOPIC, name=orders-, patternType=PREFIXED)" in listed
    assert "(principal=User:alice, host=10.1.2.3, operation=READ, permissionType=ALLOW)" in listed
    assert "ResourcePattern(resourceType=TOPIC, name=secret, patternType=LITERAL)" in listed
    assert "(principal=User:ANONYMOUS, host=*, operation=WRITE, permissionType=DENY)" in listed
    kafka_tool(
        "kafka-acls", *b, "--remove", "--force", "--allow-principal", "User:alice",
        "--allow-host", "10.1.2.3", "--operation", "Read", "--topic", "orders-",
        "--resource-pattern-type", "prefixed",
    )  # fmt: skip
    assert described(admin, where(principal="User:alice")) == set()


def test_acls_survive_a_restart_and_filters_match_as_kafkas(acl_broker: AclBroker) -> None:
    acl_broker.start(authorizer_class_name=STANDARD)  # no super user from here on
    admin = acl_broker.admin()
    everything = where()
    before = described(admin, everything)
    assert key(acl(ResourceType.BROKER, "kafka-cluster", AclOperation.ALTER)) in before
    assert key(acl(ResourceType.TOPIC, "secret", AclOperation.WRITE, DENY)) in before
    literal = acl(ResourceType.TOPIC, "filt-a", AclOperation.READ)
    prefixed = acl(ResourceType.TOPIC, "filt-", AclOperation.WRITE, pattern=PREFIXED)
    wildcard = acl(ResourceType.TOPIC, "*", AclOperation.DESCRIBE, principal="User:bob")
    group = acl(ResourceType.GROUP, "filt-g", AclOperation.READ, DENY, host="10.0.0.1")
    create_acls(admin, literal, prefixed, wildcard, group)
    create_acls(admin, literal)  # twice is no error

    assert described(admin, where("filt-a", ResourcePatternType.ANY, ResourceType.TOPIC)) == {
        key(literal)
    }
    assert described(admin, where("filt-a", ResourcePatternType.MATCH, ResourceType.TOPIC)) == {
        key(literal),
        key(prefixed),
        key(wildcard),
    }
    assert described(admin, where(None, PREFIXED, ResourceType.TOPIC)) == {key(prefixed)}
    assert described(admin, where(principal="User:bob")) == {key(wildcard)}
    assert described(admin, where(host="10.0.0.1")) == {
        key(group)
    }  # fmt: skip
    # Kafka's refusals, per binding: the others are created
    refused = admin.create_acls(
        [
            acl(ResourceType.BROKER, "other-cluster", AclOperation.ALTER),
            acl(ResourceType.TOPIC, "filt-b", AclOperation.READ, host="localhost"),
            acl(ResourceType.TOPIC, "filt-b", AclOperation.READ, principal="alice"),
            acl(ResourceType.TOPIC, "filt-b", AclOperation.READ),
        ]
    )
    codes = [error_of(f) if i < 3 else (f.result(10) or 0) for i, f in enumerate(refused.values())]
    assert codes == [KafkaError.INVALID_REQUEST] * 3 + [0]
    # DeleteAcls with a MATCH filter deletes every binding that applies to the name
    deleted = admin.delete_acls([where("filt-zzz", ResourcePatternType.MATCH, ResourceType.TOPIC)])
    assert {key(b) for b in next(iter(deleted.values())).result(10)} == {
        key(prefixed),
        key(wildcard),
    }
    deleted = admin.delete_acls(
        [
            where("filt-a", LITERAL, ResourceType.TOPIC),
            where("filt-b", LITERAL, ResourceType.TOPIC),
            where("filt-g", LITERAL, ResourceType.GROUP),
        ]
    )
    assert {key(b) for f in deleted.values() for b in f.result(10)} == {
        key(literal),
        key(group),
        key(acl(ResourceType.TOPIC, "filt-b", AclOperation.READ)),
    }
    assert described(admin, everything) == before


def test_clients_are_refused_what_no_acl_allows(acl_broker: AclBroker) -> None:
    import kafka
    from kafka.errors import TopicAuthorizationFailedError

    bootstrap = acl_broker.bootstrap
    admin = acl_broker.admin()
    topic = ResourceType.TOPIC
    # CreateTopics without CREATE on the cluster or the topic
    code = error_of(admin.create_topics([NewTopic("enf-ok", 1)])["enf-ok"])
    assert code == KafkaError.TOPIC_AUTHORIZATION_FAILED
    create_acls(
        admin,
        acl(topic, "enf-", AclOperation.CREATE, pattern=PREFIXED),
        acl(topic, "enf-", AclOperation.WRITE, pattern=PREFIXED),
        acl(topic, "enf-", AclOperation.READ, pattern=PREFIXED),
        acl(topic, "enf-denied", AclOperation.WRITE, DENY),
    )
    for future in admin.create_topics([NewTopic("enf-ok", 1), NewTopic("enf-denied", 1)]).values():
        future.result(10)
    # Metadata lists the topics the principal may describe, not the super user's "secret"
    listed = set(admin.list_topics(timeout=10).topics)
    assert {"enf-ok", "enf-denied"} <= listed and "secret" not in listed
    # Produce: a PREFIXED allow lets it, a DENY beats it, no ACL refuses
    assert produce(bootstrap, "enf-ok") is None
    assert present(produce(bootstrap, "enf-denied")).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert present(produce(bootstrap, "secret")).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # an idempotent producer: WRITE on some topic implies IDEMPOTENT_WRITE (Kafka 3.0+)
    assert produce(bootstrap, "enf-ok", **{"enable.idempotence": True}) is None
    # a transactional one needs its transactional id
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": "enf-txn"})
    with pytest.raises(KafkaException) as caught:
        txn.init_transactions(10)
    assert caught.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    # kafka-python sees the same refusal
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send("enf-denied", b"v").get(timeout=15)
    finally:
        producer.close(timeout=5)
    # a consumer without READ on its group
    group = "enf-group"
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
    )
    try:
        consumer.subscribe(["enf-ok"])

        def refused() -> bool:
            msg = consumer.poll(0.5)
            error = msg.error() if msg is not None else None
            return error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED

        wait_for(refused, 30, interval=0, what="GROUP_AUTHORIZATION_FAILED")
        create_acls(admin, acl(ResourceType.GROUP, group, AclOperation.READ))

        def consumed() -> bool:
            msg = consumer.poll(0.5)
            return msg is not None and msg.error() is None and msg.value() == b"v"

        wait_for(consumed, 30, interval=0, what="a record once the group may be read")
    finally:
        consumer.close()
    # a KIP-848 consumer that may DESCRIBE its group (FindCoordinator) but not READ it
    # (ConsumerGroupHeartbeat)
    create_acls(admin, acl(ResourceType.GROUP, "enf-848", AclOperation.DESCRIBE))
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "enf-848", "group.protocol": "consumer"}
    )
    try:
        consumer.subscribe(["enf-ok"])

        def heartbeat_refused() -> bool:  # librdkafka makes it fatal, naming the broker's error
            msg = consumer.poll(0.5)
            error = msg.error() if msg is not None else None
            return error is not None and "Group authorization failed" in error.str()

        wait_for(heartbeat_refused, 30, interval=0, what="GROUP_AUTHORIZATION_FAILED (KIP-848)")
    finally:
        consumer.close()
    # a table-topic config change needs ALTER_CONFIGS on the topic
    change = ConfigResource(
        "topic",
        "enf-ok",
        incremental_configs=[
            ConfigEntry(
                "automq.table.topic.commit.interval.ms",
                "60000",
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    code = error_of(admin.incremental_alter_configs([change])[change])
    assert code == KafkaError.TOPIC_AUTHORIZATION_FAILED
    create_acls(admin, acl(topic, "enf-ok", AclOperation.ALTER_CONFIGS))
    admin.incremental_alter_configs([change])[change].result(10)
    # the authorized operations the principal has (KIP-430)
    cluster = admin.describe_cluster(include_authorized_operations=True).result(10)
    assert set(cluster.authorized_operations) == {AclOperation.ALTER, AclOperation.DESCRIBE}
    described_topic = admin.describe_topics(
        TopicCollection(["enf-ok"]), include_authorized_operations=True
    )["enf-ok"].result(10)
    assert set(described_topic.authorized_operations) == {
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DESCRIBE,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    }
    described_group = admin.describe_consumer_groups([group], include_authorized_operations=True)[
        group
    ].result(10)
    assert set(described_group.authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE}
    # a request refused as a whole: Heartbeat without READ on the group
    assert rawkafka.heartbeat(bootstrap, "enf-848", 1, "m") == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert rawkafka.describe_acls_error(bootstrap) == (KafkaError.NO_ERROR, None)
    # a group the principal may not describe
    other = f"enf-other-{uuid.uuid4()}"
    code = error_of(admin.describe_consumer_groups([other])[other])
    assert code == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_allow_everyone_if_no_acl_found_and_no_authorizer(acl_broker: AclBroker) -> None:
    acl_broker.start(authorizer_class_name=STANDARD, allow_everyone_if_no_acl_found="true")
    admin = acl_broker.admin()
    # nothing matches: allowed (even creating ACLs); a DENY still refuses
    for future in admin.create_topics(
        [NewTopic("everyone", 1), NewTopic("everyone-but", 1)]
    ).values():
        future.result(10)
    create_acls(admin, acl(ResourceType.TOPIC, "everyone-but", AclOperation.WRITE, DENY))
    assert produce(acl_broker.bootstrap, "everyone") is None
    assert present(produce(acl_broker.bootstrap, "everyone-but")).code() == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    # ... and no other principal's READ either: a resource with an ACL has its ACLs enforced
    assert rawkafka.fetch_error(acl_broker.bootstrap, "everyone-but") == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    # the registry's _schemas: no Kafka client but a super user writes or deletes it, and
    # reading it takes a literal ACL (allow.everyone.if.no.acl.found is not enough)
    assert_schemas_guarded(present(acl_broker.process), admin)
    assert rawkafka.fetch_error(acl_broker.bootstrap, "_schemas") == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    create_acls(admin, acl(ResourceType.TOPIC, "_schemas", AclOperation.READ))
    assert rawkafka.fetch_error(acl_broker.bootstrap, "_schemas") == KafkaError.NO_ERROR
    # no authorizer: everything allowed, the ACL APIs answer SECURITY_DISABLED, as Kafka
    acl_broker.start()
    admin = acl_broker.admin()
    assert produce(acl_broker.bootstrap, "everyone-but") is None
    assert_schemas_guarded(present(acl_broker.process), admin)
    binding = acl(ResourceType.TOPIC, "t", AclOperation.READ)
    assert error_of(admin.create_acls([binding])[binding]) == KafkaError.SECURITY_DISABLED
    # (librdkafka drops DescribeAcls' error code: asked here with a one-request client)
    assert rawkafka.describe_acls_error(acl_broker.bootstrap) == (
        KafkaError.SECURITY_DISABLED,
        "No Authorizer is configured on the broker",
    )
    cluster = admin.describe_cluster(include_authorized_operations=True).result(10)
    assert set(cluster.authorized_operations) == {
        AclOperation.CREATE,
        AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
    }
