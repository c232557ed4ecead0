"""The ``icefall`` command."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from broker import log_setup
from broker.config import (
    SCALAR_FIELDS,
    SECRET_FIELDS,
    BrokerConfig,
    ConfigError,
    load_broker_config,
    parse_overrides,
    property_key,
)


def _broker_config(args: argparse.Namespace) -> BrokerConfig:
    flags = {name: getattr(args, name) for name in SCALAR_FIELDS if name not in SECRET_FIELDS}
    flags["object_store"] = args.object_store
    return load_broker_config(
        Path(args.config) if args.config else None, parse_overrides(args.override), flags
    )


def _add_broker_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting of ``BrokerConfig``, generated from the model (its descriptions are
    the help); each beats the config file and the environment. ``--override key=value`` takes
    any setting by its property key, as ``kafka-server-start.sh --override`` does."""
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="a server.properties file (key=value lines; flags and --override win over it)",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set one property (any key of the config file), e.g. segment.flush.ms=100",
    )
    for name in SCALAR_FIELDS:
        if name in SECRET_FIELDS:  # argv shows in ps: secrets come from the file or ICEFALL_*
            continue
        field = BrokerConfig.model_fields[name]
        flag = "--" + name.replace("_", "-")
        default = field.get_default(call_default_factory=False)
        help_text = f"{field.description} (default {default}; key {property_key(name)})"
        if field.annotation is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            kind = int if field.annotation in (int, int | None) else str
            parser.add_argument(flag, type=kind, default=None, help=help_text)
    parser.add_argument(
        "--object-store",
        default=None,
        help=f"{BrokerConfig.model_fields['object_store'].description} (key object.store)",
    )
    parser.add_argument(
        "--ready-file", default=None, help="write the pid here once listening (for tests)"
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        help="DEBUG, INFO, WARNING or ERROR (default INFO; above DEBUG without the per-call "
        "INFO lines of pyiceberg, httpx and py4j)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="icefall", description="Kafka topics to Apache Iceberg tables"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    broker = sub.add_parser("broker", help="run the broker (Kafka, admin API)")
    _add_broker_flags(broker)
    up = sub.add_parser(
        "up", help="run the whole system on the embedded defaults, with a demo producer"
    )
    _add_broker_flags(up)
    up.add_argument("--demo-rate", type=float, default=20.0, help="demo records per second")
    scram = sub.add_parser(
        "scram-add",
        help=(
            "store a SCRAM user in the broker's metadata (the first user of a cluster with "
            "SASL listeners only, as kafka-storage format --add-scram)"
        ),
    )
    _add_broker_flags(scram)
    scram.add_argument("--user", required=True)
    scram.add_argument(
        "--mechanism", choices=["SCRAM-SHA-256", "SCRAM-SHA-512"], default="SCRAM-SHA-512"
    )
    scram.add_argument("--iterations", type=int, default=4096)
    scram.add_argument(
        "--password", default=None, help="the password (default: read one line from stdin)"
    )
    cluster = sub.add_parser(
        "cluster",
        help="show the cluster's brokers and partition leaders (cluster mode), or move a partition",
    )
    cluster.add_argument(
        "--admin-url",
        default="http://127.0.0.1:8090",
        help="any broker's admin API (default http://127.0.0.1:8090)",
    )
    cluster.add_argument("--json", action="store_true", help="print the admin API's JSON")
    cluster_sub = cluster.add_subparsers(dest="cluster_command")
    move = cluster_sub.add_parser(
        "move", help="move a partition's leadership to a broker (no data is copied)"
    )
    move.add_argument("--topic", required=True)
    move.add_argument("--partition", type=int, required=True)
    move.add_argument(
        "--to", type=int, default=None, help="the broker's node id (omit: drop the preference)"
    )
    args = parser.parse_args(argv)
    if args.command == "cluster":
        return _cluster_command(args)
    try:
        log_setup.configure(args.log_level)
    except ValueError as exc:
        print(f"icefall: --log-level: {exc}", file=sys.stderr)
        return 2
    try:
        config = _broker_config(args)
        if args.command == "up":
            from broker.supervisor.up_settings import load_up_settings

            up_settings = load_up_settings()
    except ConfigError as exc:
        print(f"icefall: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if args.command == "broker":
        from broker.app import serve
        from broker.security.listeners import ListenerError
        from broker.storage.leases import NodeIdInUseError
        from broker.storage.logstore import UpgradedWalError
        from broker.storage.metadata import MetadataUnavailableError

        try:
            asyncio.run(serve(config, args.ready_file))
        except (
            MetadataUnavailableError,
            NodeIdInUseError,
            ListenerError,
            ConfigError,
            UpgradedWalError,
        ) as exc:
            print(f"icefall: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "scram-add":
        from broker.security.scram import add_user

        password = args.password if args.password is not None else sys.stdin.readline().rstrip("\n")
        problem = add_user(config, args.user, args.mechanism, password, args.iterations)
        if problem is not None:
            print(f"icefall: {problem}", file=sys.stderr)
            return 2
        print(f"stored {args.mechanism} credentials of user {args.user}")
        return 0
    if args.command == "up":
        from broker.supervisor.up import run_up

        return run_up(config, args.demo_rate, up_settings)
    return 2


def _cluster_command(args: argparse.Namespace) -> int:
    """``icefall cluster``: the assignment any broker's admin API serves; ``move``: change it."""
    from broker.admin_client import BrokerError
    from broker.assignment import Move, get_assignment, post_move, render

    try:
        if args.cluster_command == "move":
            post_move(
                args.admin_url, Move(topic=args.topic, partition=args.partition, node_id=args.to)
            )
            target = "no preferred broker" if args.to is None else f"broker {args.to}"
            print(f"{args.topic}-{args.partition} moves to {target} within a heartbeat")
            return 0
        assignment = get_assignment(args.admin_url)
    except (
        BrokerError,
        ValueError,
    ) as exc:  # ValueError: no URL, or an answer that is no assignment
        print(f"icefall: {exc}", file=sys.stderr)
        return 2
    print(assignment.model_dump_json(indent=2) if args.json else render(assignment))
    return 0


if __name__ == "__main__":
    sys.exit(main())
