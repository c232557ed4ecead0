"""Helpers shared by the benchmark scripts: the machine, CPU time, a broker on free ports, a
produce that waits for room in the client's queue, and a confluent-kafka producer and consumer
that time a topic's records (``confluent_produce``, ``confluent_consume``)."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support import BrokerProcess  # noqa: E402 (needs the sys.path entry above)

MIB = 1024 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")

__all__ = [
    "MIB",
    "REPO",
    "CONSUMER_SETTINGS",
    "BrokerProcess",
    "ClientRun",
    "CpuByProcess",
    "Measure",
    "ProcStat",
    "ProcessLedger",
    "Sampler",
    "become_subreaper",
    "cmdline",
    "confluent_consume",
    "confluent_produce",
    "interrupt_on_sigterm",
    "leave_no_processes",
    "machine",
    "measure",
    "own_children",
    "pid_cpu_seconds",
    "proc_stat",
    "proc_stats",
    "produce_when_room",
    "reap_orphans",
    "run_info",
    "stop_processes",
]


def run_info() -> dict[str, Any]:
    """When, where and how this benchmark ran (``sys.argv``): the head of its BENCHMARKS.md row."""
    script = f"bench/{Path(sys.argv[0]).name}"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "command": " ".join([".venv/bin/python", script, *sys.argv[1:]]),
    }


def machine() -> dict[str, str | int]:
    """nproc, CPU model, memory, kernel and Python: what a BENCHMARKS.md row names."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024)
    except OSError:
        pass
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": model,
        "mem_gib": mem_gib,
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
    }


def produce_when_room(producer: Any, topic: str, value: bytes, key: bytes | None = None) -> None:
    """``producer.produce`` (confluent-kafka) of one record, serving delivery reports while the
    client's local queue is full (``BufferError``) until the record fits: a benchmark's load
    waits for the broker, it never drops a record."""
    while True:
        try:
            producer.produce(topic, value, key)
        except BufferError:
            producer.poll(0.01)
        else:
            return


# What the benchmark client itself needs, whatever it measures: room for a whole run in the
# local queue (a produce waits for the broker, never for the queue), no compression, and no
# Python callback for a record the broker acknowledged (only failures call back).
_PRODUCER_BASE: dict[str, Any] = {
    "batch.num.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1024 * 1024,
    "queue.buffering.max.messages": 10_000_000,
    "compression.type": "none",
    "delivery.report.only.error": True,
}

# What the benchmark reader itself needs, whatever it measures: a new group reading from the
# start, no commits, and ``fetch.queue.backoff.ms`` 1: once a partition's local queue holds
# ``queued.min.messages`` (100,000: 49 MiB of 512 B records) librdkafka stops fetching it and,
# by default, looks again only after 1 s, so a reader faster than the prefetch sat out a
# second at a time (a 1,000,000-record read took 4-5 s instead of 1).
_CONSUMER_BASE: dict[str, Any] = {
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
    "fetch.queue.backoff.ms": 1,
}

# bench/produce_consume.py's fetch sizes: 64 MiB a request, 16 MiB a partition.
CONSUMER_SETTINGS: dict[str, Any] = {
    "fetch.max.bytes": 64 * MIB,
    "max.partition.fetch.bytes": 16 * MIB,
}

_BATCH = 10_000  # records per produce_batch call (5 MiB of 512 B values)


@dataclass
class ClientRun:
    """One confluent-kafka produce or consume: records and value bytes moved, the wall seconds
    they took, and this process's CPU seconds meanwhile (librdkafka's threads included: the
    client's whole cost, to tell a client-bound figure from a broker-bound one)."""

    records: int
    value_bytes: int
    seconds: float
    client_cpu_s: float

    @property
    def mib_s(self) -> float:
        return self.value_bytes / MIB / self.seconds

    @property
    def records_s(self) -> float:
        return self.records / self.seconds


def confluent_produce(
    bootstrap: str,
    topic: str,
    count: int,
    record_size: int,
    settings: Mapping[str, Any],
    partitions: int | None = None,
) -> ClientRun:
    """``count`` records of one pre-built ``record_size``-byte random value, no key, to
    ``topic`` with confluent-kafka and ``settings`` (acks, linger.ms, batch.size: the caller's
    choice), timed from the first record handed over to the last one acknowledged (``flush``).
    With ``partitions``, the records go to the partitions in turn, ``_BATCH`` / ``partitions``
    at a time (the same layout on every broker; librdkafka's own choice for keyless records
    sticks to a random partition for a while and left one partition with 2.5 x another's
    records).

    Why ``produce_batch`` of one pre-built list: a Python ``produce()`` call and delivery
    callback per record cost the client about half again the CPU, on the cores the broker
    needs; here Python does close to nothing per record, so librdkafka and the broker set the
    rate. A record the client's queue has no room for is offered again once the queue drains
    (a wait, never a drop); a record the broker or client refuses fails the run, named."""
    from confluent_kafka import KafkaError, Producer

    failures: list[str] = []

    def failed(err: Any, msg: Any) -> None:  # with delivery.report.only.error: failures only
        failures.append(str(err))

    producer = Producer(
        {**_PRODUCER_BASE, **settings, "bootstrap.servers": bootstrap, "on_delivery": failed}
    )
    producer.list_topics(topic, timeout=30)  # connected, metadata known: not in the timing
    value = os.urandom(record_size)
    # with ``partitions``: each call's records to one partition, the partitions in turn
    targets: list[int | None] = list(range(partitions)) if partitions else [None]
    batch: list[dict[str, Any]] = [
        {"value": value} for _ in range(min(_BATCH // len(targets), count))
    ]
    cpu0, start = time.process_time(), time.perf_counter()
    sent = turn = 0
    while sent < count:
        n = min(len(batch), count - sent)
        pending = batch if n == len(batch) else batch[:n]
        target = targets[turn % len(targets)]
        turn += 1
        while pending:
            queued = (
                producer.produce_batch(topic, pending)
                if target is None
                else producer.produce_batch(topic, pending, partition=target)
            )
            if queued == len(pending):
                break
            # the records not queued carry ``_error``: a full queue is a wait, else a failure
            refused = [message for message in pending if "_error" in message]
            for message in refused:
                error = message.pop("_error")
                if error.code() != KafkaError._QUEUE_FULL:
                    raise RuntimeError(f"confluent-kafka refused a record for {topic}: {error}")
            pending = refused
            producer.poll(0.01)
        sent += n
        producer.poll(0)
    undelivered = producer.flush(600)
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    if undelivered or failures:
        raise RuntimeError(
            f"{undelivered} records not acknowledged within 600 s, "
            f"{len(failures)} refused ({failures[:3]}) producing to {topic}"
        )
    return ClientRun(count, count * record_size, seconds, cpu)


def confluent_consume(
    bootstrap: str,
    topic: str,
    count: int,
    settings: Mapping[str, Any] = CONSUMER_SETTINGS,
    timeout: float = 600,
) -> ClientRun:
    """Read ``count`` records of ``topic`` from the start of every partition with a
    confluent-kafka consumer of a new group (``settings``: its fetch sizes), timed from
    ``assign`` (the partitions already known: no group join in the time, as in
    ``kafka-consumer-perf-test``'s fetch time) to the last record. A record with an error,
    or fewer than ``count`` records within ``timeout`` s, fails the run."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    consumer = Consumer(
        {
            **_CONSUMER_BASE,
            **settings,
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions]
        cpu0, start = time.process_time(), time.perf_counter()
        deadline = time.monotonic() + timeout
        consumer.assign(partitions)
        got = size = 0
        while got < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumed {got} of {count} records of {topic} in {timeout} s")
            # never ask for more than is left: a batch short of its size waits out the timeout
            for message in consumer.consume(min(10_000, count - got), 1.0):
                if message.error():
                    raise KafkaException(message.error())
                got += 1
                size += len(message)
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu0
    finally:
        consumer.close()
    return ClientRun(got, size, seconds, cpu)


@dataclass(frozen=True)
class ProcStat:
    """The fields of one ``/proc/<pid>/stat`` the CPU counts need, times in seconds."""

    ppid: int
    start: int  # field 22, clock ticks after boot: with the pid, names one process (pids wrap)
    own: float  # utime + stime (fields 14, 15): its own threads'
    reaped: float  # cutime + cstime (16, 17): its children it waited for, each whole


def _parse_stat(text: str) -> ProcStat:
    fields = text.rsplit(")", 1)[1].split()  # the command in (...) may hold spaces
    return ProcStat(
        ppid=int(fields[1]),
        start=int(fields[19]),
        own=(int(fields[11]) + int(fields[12])) / CLK_TCK,
        reaped=(int(fields[13]) + int(fields[14])) / CLK_TCK,
    )


def proc_stat(pid: int) -> ProcStat | None:
    """``pid``'s stat, ``None`` once it is gone (a zombie still has one: its final times)."""
    try:
        return _parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def proc_stats() -> dict[int, ProcStat]:
    """Every process's stat, by pid."""
    out: dict[int, ProcStat] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))) is not None:
            out[int(entry.name)] = stat
    return out


def pid_cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a live process (not its children), from /proc."""
    stat = proc_stat(pid)
    return stat.own if stat else 0.0


def _rusage_seconds(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


@dataclass
class Measure:
    """Wall time and CPU time of a block: this process, its reaped children, other watched pids."""

    wall: float = 0.0
    cpu_self: float = 0.0
    cpu_children: float = 0.0
    cpu_watched: dict[str, float] = field(default_factory=dict)

    @property
    def cpu_total(self) -> float:
        return self.cpu_self + self.cpu_children + sum(self.cpu_watched.values())


@contextmanager
def measure(watch: dict[str, int] | None = None) -> Iterator[Measure]:
    """Measure the block. ``watch``: name -> pid of other live processes (e.g. the
    broker) whose CPU time spent during the block counts too."""
    watch = watch or {}
    m = Measure()
    before = {name: pid_cpu_seconds(pid) for name, pid in watch.items()}
    s0, c0 = _rusage_seconds(resource.RUSAGE_SELF), _rusage_seconds(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        yield m
    finally:
        m.wall = time.perf_counter() - t0
        m.cpu_self = _rusage_seconds(resource.RUSAGE_SELF) - s0
        m.cpu_children = _rusage_seconds(resource.RUSAGE_CHILDREN) - c0
        m.cpu_watched = {name: pid_cpu_seconds(pid) - before[name] for name, pid in watch.items()}


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``), so the CPU time of
    processes their parent never waits for (PySpark's JVM, its Python workers) can be
    collected by ``reap_orphans`` and shows up in ``RUSAGE_CHILDREN``."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(36, 1, 0, 0, 0) == 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _children(pid: int) -> set[int]:
    return {child for child, stat in proc_stats().items() if stat.ppid == pid}


def own_children() -> set[int]:
    """The pids whose parent is this process (with ``become_subreaper``, adopted orphans too)."""
    return _children(os.getpid())


def _parents() -> dict[int, int]:
    return {pid: stat.ppid for pid, stat in proc_stats().items()}


def _tree(roots: set[int], parents: dict[int, int]) -> set[int]:
    tree = set(roots)
    grew = True
    while grew:
        new = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= new
        grew = bool(new)
    return tree


def stop_processes(roots: set[int], timeout: float = 10.0) -> None:
    """SIGTERM the processes ``roots`` and all their descendants (pids from /proc), then
    SIGKILL whatever is still alive after ``timeout``; reap those that are this process's
    children. For a round interrupted half-way: its driver, JVM and Python workers."""
    pids = _tree(roots, _parents()) - {os.getpid()}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid in pids & own_children():
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            pids = {pid for pid in pids if Path(f"/proc/{pid}").exists() and _state(pid) != "Z"}
            if not pids:
                return
            time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def interrupt_on_sigterm() -> None:
    """SIGTERM raises KeyboardInterrupt like Ctrl-C, so ``finally`` blocks stop what a benchmark started."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


@contextmanager
def leave_no_processes(grace: float = 150.0) -> Iterator[None]:
    """A benchmark's ``main``: whatever way it ends, no process it started is left running.

    Becomes a subreaper (an orphaned Spark JVM or Python worker is re-parented to this process,
    not to init, so it can be found). SIGTERM and SIGINT raise KeyboardInterrupt, so the
    ``finally`` blocks stop what they started gracefully (``icefall up`` with SIGINT, a
    producer flushed); should those take longer than ``grace`` s (a wait on a round that runs
    on), a watchdog stops every descendant; a second signal does it at once. On the way out,
    whatever still descends from this process (adopted orphans included) is SIGTERMed, then
    SIGKILLed (``stop_processes``)."""
    become_subreaper()
    interrupted = threading.Event()
    timers: list[threading.Timer] = []

    def sweep(timeout: float) -> None:
        stop_processes(own_children(), timeout=timeout)

    def handler(signum: int, frame: object) -> None:
        if interrupted.is_set():
            sweep(5.0)
        else:
            interrupted.set()
            watchdog = threading.Timer(grace, sweep, (10.0,))
            watchdog.daemon = True
            watchdog.start()
            timers.append(watchdog)
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()
        sweep(10.0)
        for sig, old in previous.items():
            signal.signal(sig, old)


def reap_orphans(exclude: set[int], timeout: float = 60.0) -> int:
    """Wait until this process has no children outside ``exclude`` (adopted orphans
    exiting); return how many were reaped. Those still alive at ``timeout`` are left."""
    deadline = time.monotonic() + timeout
    reaped = 0
    while time.monotonic() < deadline:
        pending = _children(os.getpid()) - exclude
        if not pending:
            break
        for pid in pending:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            reaped += bool(done)
        time.sleep(0.05)
    return reaped


def cmdline(pid: int) -> str | None:
    """``pid``'s command line, arguments joined by spaces; ``None`` once it is gone ("" for a
    zombie)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace")


class Sampler:
    """Calls ``sample()`` every ``interval`` s on a daemon thread from ``start_sampling()`` until
    ``stop_sampling()``: the loop of the CPU samplers (this module's, bench/airflow_cpu.py's)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        raise NotImplementedError

    def start_sampling(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def stop_sampling(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


Key = tuple[int, int]  # (pid, start time): one process, whatever later reuses its pid

# how far a reaper's children time may fall short of a child's last sample and still hold it:
# the kernel adds the child's time to its parent's in nanoseconds, /proc shows each field in
# clock ticks rounded down, so the parent's sum may show a tick or two less than the child's
_TICKS = 3 / CLK_TCK

Label = TypeVar("Label", bound=Hashable)


@dataclass
class _Process(Generic[Label]):
    label: Label
    stat: ProcStat  # the last sample: for a process that ended, its last known times
    parent: Key | None  # its parent's entry at the last sample, if that one is measured too
    alive: bool = True
    reaper: Key | None = None  # the entry whose children time holds this ended one whole
    base: float = 0.0  # its children time at the sample before: what the last one added


class ProcessLedger(Generic[Label]):
    """The CPU seconds of a set of processes, sampled, without losing or double counting a
    process that ended: the bookkeeping of ``CpuByProcess`` and bench/airflow_cpu.py's
    ``ComponentCpu``.

    A process is an entry keyed by (pid, start time): pids wrap (``pid_max`` 32768 here, and
    a JVM's threads use the same space), so a new process under an old pid is a new entry.
    A live process counts its own time (utime+stime) and its reaped children's (cutime+cstime,
    which the kernel adds when its parent waits for it: a child's whole time, its tail after
    the last sample and its own reaped descendants included). So a process that ended counts
    nothing itself when its parent's entry, sampled after it ended, shows children time grown
    by at least its last sample: it is inside that reaper's count (``reaper``). When its
    parent ended within the same interval, the nearest live ancestor that reaped the parent
    is looked at the same way (the parent's children time went into it). Otherwise (its
    parent is not measured, ended before it, or never waited for it) it counts its last
    sample: the best there is, its tail after that sample lost. For the split by label,
    an ended process keeps its last sample under its own label and takes it out of its
    reaper's (``shares``): a task process stays a task process, only its unsampled tail is
    charged to the process that reaped it.

    A caller takes differences between two readings: a live process's children time may
    hold children that ended before the first sample, or were never measured."""

    def __init__(self) -> None:
        self.entries: dict[Key, _Process[Label]] = {}
        self.lock = threading.RLock()  # the sampling thread and a caller reading now

    def alive(self) -> dict[int, Key]:
        """pid -> entry of the processes alive at the last sample."""
        return {key[0]: key for key, entry in self.entries.items() if entry.alive}

    def observe(
        self,
        seen: Mapping[int, tuple[ProcStat, Label]],
        reread: Callable[[int], ProcStat | None] = proc_stat,
    ) -> None:
        """One sample: ``seen`` is pid -> (stat, label) of every measured process alive now
        (the tree, and those already known that still run, wherever they hang now); a known
        process not in it has ended. ``reread`` reads a reaper's stat again once its child is
        known to be gone, so its children time already holds the child."""
        with self.lock:
            keys = {pid: (pid, stat.start) for pid, (stat, _) in seen.items()}
            for pid, (stat, label) in seen.items():
                entry = self.entries.get(keys[pid])
                if entry is None:
                    self.entries[keys[pid]] = _Process(
                        label, stat, keys.get(stat.ppid), base=stat.reaped
                    )
                else:
                    entry.base = entry.stat.reaped
                    entry.label, entry.stat, entry.parent = label, stat, keys.get(stat.ppid)
            now = set(keys.values())
            ended = {key for key, entry in self.entries.items() if entry.alive and key not in now}
            for key in ended:
                self.entries[key].alive = False
            self._settle(ended, reread)

    def _settle(self, ended: set[Key], reread: Callable[[int], ProcStat | None]) -> None:
        """Find the reaper of each process that ended since the sample before."""
        taken: dict[Key, float] = {}  # children time of each reaper held by the ended so far
        fresh: dict[Key, bool] = {}  # reaper -> read again after its child was gone

        def depth(key: Key) -> int:
            n, parent = 0, self.entries[key].parent
            while parent in ended and n < 100:
                n, parent = n + 1, self.entries[parent].parent
            return n

        for key in sorted(ended, key=depth):  # a parent before its children
            entry = self.entries[key]
            reaper = entry.parent
            while reaper is not None and reaper in ended:  # it ended too: who reaped it
                reaper = self.entries[reaper].parent
            if reaper is None or not self.entries[reaper].alive:
                continue  # not measured, or gone before the child ended: orphaned
            holder = self.entries[reaper]
            if reaper not in fresh:
                again = reread(reaper[0])
                fresh[reaper] = again is not None and again.start == reaper[1]
                if fresh[reaper] and again is not None:
                    holder.stat = again
            if not fresh[reaper]:
                continue  # it ended just now: which children it held is unknown
            room = holder.stat.reaped - holder.base - taken.get(reaper, 0.0)
            whole = entry.stat.own + entry.stat.reaped
            if room + _TICKS >= whole:
                entry.reaper = reaper
                taken[reaper] = taken.get(reaper, 0.0) + min(whole, room)

    def shares(self) -> list[tuple[Label, float, float]]:
        """(label, own seconds, reaped seconds) per entry; for an ended one held by a reaper,
        also (the reaper's label, 0, minus its whole): summed, every process counts once."""
        with self.lock:
            out: list[tuple[Label, float, float]] = []
            for entry in self.entries.values():
                out.append((entry.label, entry.stat.own, entry.stat.reaped))
                if entry.reaper is not None:
                    whole = entry.stat.own + entry.stat.reaped
                    out.append((self.entries[entry.reaper].label, 0.0, -whole))
            return out

    def sample_tree(
        self,
        root: int,
        label: Callable[[int, str, Label | None, Mapping[int, int]], Label | None],
    ) -> None:
        """Sample ``root``'s tree from /proc and every process already known that still
        runs (an orphan re-parented out of the tree is still measured). ``label(pid, cmdline,
        its label so far or None, pid -> ppid)``: the process's label, ``None`` to leave a
        new process out (bench/airflow_cpu.py leaves out the root itself)."""
        with self.lock:
            stats = proc_stats()
            parents = {pid: stat.ppid for pid, stat in stats.items()}
            tree = _tree({root}, parents)
            seen: dict[int, tuple[ProcStat, Label]] = {}
            for pid in tree | set(self.alive()):
                stat = stats.get(pid)
                cmd = cmdline(pid)
                if stat is None or cmd is None:
                    continue  # gone meanwhile
                before = self.entries.get((pid, stat.start))
                if before is None and pid not in tree:
                    continue  # a known pid, now another process out of the tree: not ours
                kind = label(pid, cmd, before.label if before else None, parents)
                if kind is not None:
                    seen[pid] = (stat, kind)
            self.observe(seen)


class CpuByProcess(Sampler):
    """Samples the CPU time of a process tree (every ``interval`` s) and sums it per kind of
    process (``classify(cmdline) -> name``): where a multi-process job spends its CPU.

    Counted by ``ProcessLedger``: per process keyed by pid and start time, a live one its own
    time and its reaped children's; one that ended counts whole through its reaper's children
    time, its last sample under its own kind and only the tail after it under the reaper's.
    One whose reaper is not measured, or whose kind the caller leaves out (bench/vs_connect.py
    leaves out ``icefall up``'s own process, which reaps the ``icefall_airflow.sync``
    processes), still counts its last sample under its own kind: only its tail is lost. A
    process re-parented out of the tree (its parent ended first) stays measured until it ends,
    if a sample saw it in the tree. Not whole: a child of a parent that ignores SIGCHLD (the
    kernel reaps it without adding its time to the parent's: pyspark's worker daemon, whose
    forked Python workers end so) counts its last sample only, and one that lived under one
    interval is not seen at all."""

    def __init__(self, classify: Callable[[str], str], interval: float = 0.25) -> None:
        super().__init__(interval)
        self.classify = classify
        self.ledger: ProcessLedger[str] = ProcessLedger()
        self.root: int | None = None

    def start(self, root: int) -> None:
        self.root = root
        self.start_sampling()

    def _label(
        self, pid: int, cmd: str, before: str | None, parents: Mapping[int, int]
    ) -> str | None:
        # classified anew while it has a command line (exec changes it); a zombie has none: it
        # keeps its kind, and one first seen as a zombie (it lived within one interval) is left
        # out, so its whole time counts in its reaper's children time, as if never seen (it was
        # "other", and the reaper's share lost it to that kind)
        return self.classify(cmd) if cmd.strip() else before

    def sample(self) -> None:
        if self.root is not None:
            self.ledger.sample_tree(self.root, self._label)

    def by_kind(self) -> dict[str, float]:
        """CPU seconds per kind as of now (sampled first), not rounded."""
        self.sample()
        out: dict[str, float] = {}
        for kind, own, reaped in self.ledger.shares():
            out[kind] = out.get(kind, 0.0) + own + reaped
        return out

    def stop(self) -> dict[str, float]:
        """Stop sampling; CPU seconds per kind, a last sample included, to 0.1 s."""
        self.stop_sampling()
        return {kind: round(seconds, 1) for kind, seconds in self.by_kind().items()}
