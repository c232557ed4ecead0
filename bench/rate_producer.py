"""A cheap fixed-rate producer of bench/commit_round.py's Avro values, in a process of its own.

Why a process: the sustained benchmark (bench/sustained.py) offers up to ~60 MiB/s of ~500 B
values on the same 2 cores as the system it measures. A Python loop with one ``produce()`` and
one Python delivery callback per record cost 12 CPU-s per GiB and could not offer 20 MiB/s
from the bench process. Here the work per record done in Python is close to none:

- the values come from a pool of pre-built message dicts (``POOL_SIZE``; a rolling slice of it
  is re-encoded every ``REFRESH_S`` with new ids and the current ``event_time``, so the table
  still gets fresh rows), handed to librdkafka by ``produce_batch`` in slices;
- ``delivery.report.only.error=true``: no Python callback for a record the broker acknowledged;
  acknowledged = sent - ``len(producer)`` (messages not yet delivered) - failures;
- larger batches (``linger.ms`` 50, ``batch.size`` 1 MB, lz4), acks=all as before.

Its own process also keeps its CPU apart from the bench's (it reports ``time.process_time()``,
librdkafka's threads included) and lets the bench's GIL be.

Protocol (line based, so a parent in any state can drive it): stdin takes ``<MiB/s>`` lines (the
rate of value bytes, changeable at any time); EOF on stdin (the parent closed it, exited or was
killed) stops it: it flushes for up to ``FLUSH_S``, prints its last stats line and exits.
Every ``STATS_S`` it prints a JSON line to stdout: ``sent``, ``acked``, ``value_bytes``,
``failures`` (records the broker or librdkafka refused, with the first few errors in
``errors``), ``pending`` (``len(producer)``) and ``cpu_s``; the last one has ``"done": true``.
Nothing is retried silently past librdkafka's own retries: a failed record is counted and
named, and the parent fails the run.

    python -m bench.rate_producer --bootstrap HOST:PORT --topic T --schema-id N
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import selectors
import signal
import struct
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.commit_round import _tails, _zigzag_varint

MIB = 1024 * 1024
POOL_SIZE = 32_768
TAILS = 4_096  # distinct encodings of fields 3..16 (fastavro: ~0.4 ms each, paid at start)
REFRESH_CHUNK = 2_048  # messages re-encoded per refresh (a rolling window over the pool)
REFRESH_S = 1.0
TICK_S = 0.02  # below linger.ms: batches are as full as with a finer tick
STATS_S = 0.5
FLUSH_S = 30.0
MAX_BATCH = 8_192  # records per produce_batch call (one call per tick at up to ~400 MiB/s)


class RateProducer:
    """The produce loop: ``rate`` MiB/s of values from the pool, counted, until stopped."""

    def __init__(self, bootstrap: str, topic: str, schema_id: int) -> None:
        from confluent_kafka import KafkaError, Producer

        self.queue_full = KafkaError._QUEUE_FULL
        self.topic = topic
        self.tails, self.keys = _tails(TAILS)
        self.header = b"\x00" + struct.pack(">I", schema_id)  # Confluent wire format
        self.rate_mib_s = 0.0
        self.sent = self.value_bytes = 0
        self.failures = 0
        self.errors: list[str] = []
        self.next_id = 0
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 50,
                "batch.size": 1_000_000,
                "compression.type": "lz4",
                "queue.buffering.max.kbytes": 1_048_576,
                "queue.buffering.max.messages": 2_000_000,
                "delivery.report.only.error": True,
                "on_delivery": self._failed,
                "error_cb": self._error,
            }
        )
        now_ms = int(time.time() * 1000)
        self.pool = [self._message(now_ms) for _ in range(POOL_SIZE)]
        self.ends: list[int] = []  # cumulative value bytes of pool[0..i], for value_bytes
        self._sizes()
        self.refresh_at = 0
        self.pos = 0

    def _message(self, now_ms: int) -> dict[str, Any]:
        """bench/vs_connect.py's ``avro_encoder`` record: id and event_time, then a tail."""
        i = self.next_id
        self.next_id += 1
        value = self.header + _zigzag_varint(i) + _zigzag_varint(now_ms) + self.tails[i % TAILS]
        return {"value": value, "key": self.keys[i % TAILS]}

    def _failed(self, err: Any, msg: Any) -> None:  # only called for failures
        self.failures += 1
        if len(self.errors) < 5:
            self.errors.append(str(err))

    def _error(self, err: Any) -> None:
        # librdkafka's transient errors (a connection lost and redone) are retried by it; a
        # record that still fails comes back through _failed. Fatal ones are named.
        if err.fatal() and len(self.errors) < 5:
            self.errors.append(f"fatal: {err}")
            self.failures += 1

    def _sizes(self) -> None:
        self.ends = list(itertools.accumulate((len(m["value"]) for m in self.pool), initial=0))
        self.mean_bytes = self.ends[-1] / POOL_SIZE

    def refresh(self) -> None:
        """Re-encode the next ``REFRESH_CHUNK`` pool entries: new ids, the current event_time."""
        now_ms = int(time.time() * 1000)
        start = self.refresh_at
        for i in range(start, start + REFRESH_CHUNK):
            self.pool[i % POOL_SIZE] = self._message(now_ms)
        self.refresh_at = (start + REFRESH_CHUNK) % POOL_SIZE
        self._sizes()

    def send(self, count: int) -> int:
        """Offer ``count`` records from the pool; return how many librdkafka queued."""
        count = min(count, MAX_BATCH, POOL_SIZE - self.pos)
        batch = self.pool[self.pos : self.pos + count]
        queued = int(self.producer.produce_batch(self.topic, batch))
        if queued < count:
            # the queue is full (back-pressure, not a failure): the rest waits for the next tick.
            # librdkafka queues in order and stops at a full queue, so the queued ones are the
            # slice's head; any other error is a failed record, counted and named.
            for message in batch:
                error = message.pop("_error", None)
                if error is not None and error.code() != self.queue_full:
                    self._failed(error, message)
                    queued += 1  # counted as sent and failed, like a delivery failure
        self.sent += queued
        self.value_bytes += self.ends[self.pos + queued] - self.ends[self.pos]
        self.pos = (self.pos + queued) % POOL_SIZE
        return queued

    def stats(self, done: bool = False) -> dict[str, Any]:
        pending = len(self.producer)
        return {
            "sent": self.sent,
            # at the end, records still pending are counted in failures (flush timed out)
            "acked": max(0, self.sent - (0 if done else pending) - self.failures),
            "value_bytes": self.value_bytes,
            "failures": self.failures,
            "errors": self.errors,
            "pending": pending,
            "cpu_s": round(time.process_time(), 2),
            "done": done,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--schema-id", type=int, required=True)
    args = parser.parse_args()
    # Ctrl-C in a terminal reaches the whole foreground group: the parent stops this process
    # (stdin closed: flush, last stats), so it is not cut short half-way.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    producer = RateProducer(args.bootstrap, args.topic, args.schema_id)
    out = sys.stdout
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
    pending_line = b""
    budget, last = 0.0, time.monotonic()
    next_stats = next_refresh = last
    print(json.dumps(producer.stats()), file=out, flush=True)  # ready: the pool is built
    while True:
        if selector.select(0):
            chunk = os.read(sys.stdin.fileno(), 4096)
            if not chunk:
                break  # EOF: the parent is done (or gone)
            pending_line += chunk
            *lines, pending_line = pending_line.split(b"\n")
            for line in lines:
                if line.strip():
                    producer.rate_mib_s = float(line)
        now = time.monotonic()
        rate = producer.rate_mib_s * MIB
        budget = min(budget + (now - last) * rate, max(2 * MIB, rate))  # at most 1 s behind
        last = now
        while budget >= producer.mean_bytes:
            queued = producer.send(int(budget / producer.mean_bytes))
            if not queued:
                producer.producer.poll(0.005)  # the queue is full: let librdkafka drain it
                break
            budget -= queued * producer.mean_bytes
        producer.producer.poll(0)
        if now >= next_refresh:
            producer.refresh()
            next_refresh = now + REFRESH_S
        if now >= next_stats:
            print(json.dumps(producer.stats()), file=out, flush=True)
            next_stats = now + STATS_S
        time.sleep(TICK_S)
    if undelivered := producer.producer.flush(FLUSH_S):
        producer.failures += undelivered  # not acknowledged in time: failed, as far as we know
        producer.errors.append(f"{undelivered} records not delivered within {FLUSH_S:g} s")
    print(json.dumps(producer.stats(done=True)), file=out, flush=True)


class ProducerProcess:
    """The parent's side: starts ``python -m bench.rate_producer``, sets its rate, reads its stats
    (a reader thread keeps the latest line), and stops it (stdin closed, then killed after
    ``FLUSH_S`` + 10 s). Used as a context manager, it is stopped on every way out."""

    def __init__(self, bootstrap: str, topic: str, schema_id: int, log: Path) -> None:
        import subprocess
        import threading

        cmd = [sys.executable, "-m", "bench.rate_producer", "--bootstrap", bootstrap]
        cmd += ["--topic", topic, "--schema-id", str(schema_id)]
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                cmd,
                cwd=Path(__file__).resolve().parent.parent,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        self.log = log
        self.last: dict[str, Any] = {}
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.last = json.loads(line)
            self.ready.set()
        self.ready.set()

    def __enter__(self) -> ProducerProcess:
        if not self.ready.wait(120) or not self.last:
            self.stop()
            raise RuntimeError(f"the producer did not start; see {self.log}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_rate(self, mib_s: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{mib_s}\n".encode())
        self.proc.stdin.flush()

    def check(self) -> None:
        """Raise if a record failed or the producer process ended before it was stopped."""
        if self.last.get("failures"):
            raise RuntimeError(
                f"{self.last['failures']} records failed to produce: {self.last['errors']}"
            )
        if self.proc.poll() is not None and not self.last.get("done"):
            raise RuntimeError(f"the producer exited {self.proc.returncode}; see {self.log}")

    def stat(self, name: str) -> Any:
        return self.last.get(name, 0)

    def stop(self) -> dict[str, Any]:
        """Close its stdin (it flushes and prints its last stats), wait; kill it past the deadline."""
        import subprocess

        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(FLUSH_S + 10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)
        return self.last


class ProducerGroup:
    """``count`` producer processes sharing a rate: ``ProducerProcess``'s interface, the stats
    summed. For a machine so busy that one process does not get the CPU the rate needs (the
    records cost the same CPU per GiB, spread over more processes)."""

    def __init__(self, bootstrap: str, topic: str, schema_id: int, log: Path, count: int) -> None:
        self.members: list[ProducerProcess] = []
        try:
            for n in range(count):
                name = log.with_name(f"{log.stem}-{n}{log.suffix}") if count > 1 else log
                self.members.append(ProducerProcess(bootstrap, topic, schema_id, name))
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> ProducerGroup:
        try:
            for member in self.members:
                member.__enter__()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_rate(self, mib_s: float) -> None:
        for member in self.members:
            member.set_rate(mib_s / len(self.members))

    def check(self) -> None:
        for member in self.members:
            member.check()

    def stat(self, name: str) -> Any:
        return sum(member.stat(name) for member in self.members)

    def stop(self) -> None:
        for member in self.members:  # all told first: they flush at the same time
            if member.proc.stdin is not None and not member.proc.stdin.closed:
                with contextlib.suppress(OSError):
                    member.proc.stdin.close()
        for member in self.members:
            member.stop()


if __name__ == "__main__":
    main()
