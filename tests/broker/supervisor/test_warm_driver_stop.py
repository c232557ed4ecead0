"""broker/supervisor/warm_driver.py ``WarmDriverProcess.stop``: the driver's process group is
given time to finish its shutdown hooks after the Python driver exits.

The group is a real one shaped like the driver's: a Python parent that dies at once on SIGTERM
(as the warm driver does) and a child in the same group that cleans up on SIGTERM before it
exits (as the JVM's shutdown hooks delete Spark's ``spark-*`` directories). Stopping must let
the child finish: a SIGKILL to the group as soon as the parent was gone left the directories."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from broker.supervisor.warm_driver import WarmDriverProcess, _group_alive

CHILD = """
import os, shutil, signal, sys, time
scratch, ready = sys.argv[1], sys.argv[2]
def hook(signum, frame):
    time.sleep(1.0)  # a shutdown hook that takes a while (deleting ~100 MB of jars)
    shutil.rmtree(scratch)
    sys.exit(0)
signal.signal(signal.SIGTERM, hook)
os.makedirs(scratch)
open(ready, "w").close()
while True:
    time.sleep(1)
"""

PARENT = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]])
while True:
    time.sleep(1)  # SIGTERM's default action ends it at once
"""


def test_stop_lets_the_group_finish_its_shutdown_hooks(tmp_path: Path) -> None:
    scratch, ready = tmp_path / "spark-scratch", tmp_path / "ready"
    driver = WarmDriverProcess({}, tmp_path, 0)
    driver.proc = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(scratch), str(ready)],
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline, "the child did not start"
        time.sleep(0.05)
    assert scratch.is_dir()
    driver.stop(timeout=15)
    assert not scratch.exists(), "the group was killed before its shutdown hook finished"
    assert not _group_alive(driver.proc.pid)
