"""The broker killed with SIGKILL at random moments under full-speed acks=all
load (tests/reliability/crash_load.py), on the local object store and on S3
(moto's server), there with the store unreachable across several kills.
tests/broker/test_durability.py covers the fixed crash windows; these runs add
random moments, several kills per run and three producer kinds. The seed is
random per run and printed in every failure message; set
``ICEFALL_RELIABILITY_SEED`` to replay one."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator

import pytest

from tests.broker.test_s3_object_store import TcpProxy
from tests.conftest import MotoS3
from tests.reliability.crash_load import assert_guarantees, run_crashes
from tests.support import BrokerProcess


def _seed() -> int:
    return int(os.environ.get("ICEFALL_RELIABILITY_SEED") or random.randrange(1 << 30))


@pytest.fixture
def s3_proxy(moto_s3: MotoS3) -> Iterator[TcpProxy]:
    proxy = TcpProxy(moto_s3.port)
    yield proxy
    proxy.down()


@pytest.mark.timeout(240)
def test_random_kills_under_load_local_store(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory(["--segment-flush-ms", "100"])
    run = run_crashes(broker, kills=3, seed=_seed(), backend="local")
    print(run.as_dict())
    assert_guarantees(run)


@pytest.mark.timeout(240)
def test_random_kills_under_load_s3_with_an_outage(
    broker_factory: Callable[..., BrokerProcess],
    moto_s3: MotoS3,
    s3_proxy: TcpProxy,
    s3_bucket: str,
) -> None:
    broker = broker_factory(
        ["--object-store", f"s3://{s3_bucket}/crash", "--segment-flush-ms", "100"],
        env=moto_s3.env(s3_proxy.endpoint),
    )
    run = run_crashes(
        broker, kills=3, seed=_seed(), backend="s3+outage", outage=(s3_proxy.down, s3_proxy.up)
    )
    print(run.as_dict())
    assert run.outage_seconds > 0
    assert_guarantees(run)
    log = broker.log_text()  # every run of the broker appends to it
    assert "segment flush failed" in log or "flushing the replayed WAL failed" in log, (
        "the outage was never felt"
    )
