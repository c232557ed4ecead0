"""One ``kill -9`` trial on a 3-broker cluster (tests/reliability/cluster_kills.py; the bench
runs many: ``bench/reliability.py --only cluster``). What tests/broker/test_cluster.py's kill
test does not cover: producers without idempotence (with and without retries) across a
failover, a random victim at a random moment, and the killed broker restarted under load
taking its share back. The seed is random per run and in every failure message;
``ICEFALL_RELIABILITY_SEED`` replays one."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.reliability.cluster_kills import run_cluster_trial, three_brokers
from tests.reliability.crash_load import assert_guarantees


@pytest.mark.timeout(240)
def test_kill_9_of_one_of_three_brokers_loses_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("ICEFALL_RELIABILITY_SEED") or random.randrange(1 << 30))
    with three_brokers(tmp_path) as brokers:
        trial = run_cluster_trial(brokers, seed=seed, max_run_s=1.0)
    print(trial.as_dict())
    assert_guarantees(trial)
    assert trial.moved, f"the victim led nothing: {trial.as_dict()}"
    assert set(trial.failover_s) == set(trial.moved), trial.as_dict()
    assert trial.group_missing == 0, trial.as_dict()
    assert trial.group_s is not None, trial.as_dict()
