"""The ``icefall`` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from broker.config import BrokerConfig, object_store_from_env


def _broker_config(args: argparse.Namespace) -> BrokerConfig:
    values: dict[str, object] = {"home": Path(args.home)}
    for name in ("host", "advertised_host", "kafka_port", "admin_port", "registry_port", "catalog_port",
                 "segment_flush_ms", "segment_flush_bytes", "catalog_uri", "metadata_uri", "warehouse",
                 "retention_check_interval_ms", "max_unflushed_bytes"):
        value = getattr(args, name)
        if value is not None:
            values[name] = value
    if args.object_store:
        values["object_store"] = object_store_from_env(args.object_store)
    if args.auto_create_topics:
        values["auto_create_topics"] = True
    return BrokerConfig(**values)  # type: ignore[arg-type]


def _add_broker_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", default=None, help="state directory (default: $ICEFALL_HOME or ./.icefall)")
    parser.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    parser.add_argument("--advertised-host", default=None, help="host name given to clients in Metadata")
    parser.add_argument("--kafka-port", type=int, default=None, help="Kafka listener (default 9092)")
    parser.add_argument("--admin-port", type=int, default=None, help="admin HTTP API (default 8090)")
    parser.add_argument("--registry-port", type=int, default=None, help="schema registry (default 8081)")
    parser.add_argument("--catalog-port", type=int, default=None, help="Iceberg REST catalog (default 8181)")
    parser.add_argument("--catalog-uri", default=None,
                        help="catalog database, a SQLAlchemy URL (default sqlite:///HOME/catalog.sqlite)")
    parser.add_argument("--metadata-uri", default=os.environ.get("ICEFALL_METADATA_URI"),
                        help="the broker's metadata in Postgres, postgresql://user:password@host:port/database "
                             "(default: $ICEFALL_METADATA_URI, else SQLite in HOME/metadata.sqlite)")
    parser.add_argument("--warehouse", default=None, help="where Iceberg tables live (default file://HOME/warehouse)")
    parser.add_argument(
        "--object-store",
        default=None,
        help="s3://bucket/prefix (endpoint and credentials from AWS_* variables); default: HOME/objects",
    )
    parser.add_argument("--segment-flush-ms", type=int, default=None, help="flush segments at least this often")
    parser.add_argument("--segment-flush-bytes", type=int, default=None, help="flush segments at this size")
    parser.add_argument("--max-unflushed-bytes", type=int, default=None,
                        help="hold produces while more than this is not yet in the object store")
    parser.add_argument(
        "--retention-check-interval-ms",
        type=int,
        default=None,
        help="run segment retention this often (Kafka's log.retention.check.interval.ms, default 300000)",
    )
    parser.add_argument("--auto-create-topics", action="store_true", help="create unknown topics on first use")
    parser.add_argument("--ready-file", default=None, help="write the pid here once listening (for tests)")
    parser.add_argument("--log-level", default="INFO")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="icefall", description="Kafka topics to Apache Iceberg tables")
    sub = parser.add_subparsers(dest="command", required=True)
    broker = sub.add_parser("broker", help="run the broker (Kafka, admin API)")
    _add_broker_flags(broker)
    up = sub.add_parser("up", help="run the whole system on the embedded defaults, with a demo producer")
    _add_broker_flags(up)
    up.add_argument("--demo-rate", type=float, default=20.0, help="demo records per second")
    args = parser.parse_args(argv)
    if args.home is None:
        args.home = os.environ.get("ICEFALL_HOME", ".icefall")
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = _broker_config(args)
    except ValidationError as exc:
        print(f"icefall: bad configuration:\n{exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if args.command == "broker":
        from broker.app import serve
        from broker.metadata import MetadataUnavailableError

        try:
            asyncio.run(serve(config, args.ready_file))
        except MetadataUnavailableError as exc:
            print(f"icefall: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "up":
        from broker.up import run_up

        return run_up(config, args.demo_rate)
    return 2


if __name__ == "__main__":
    sys.exit(main())
