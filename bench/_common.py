"""Helpers shared by the benchmark scripts: the machine, CPU time, a broker on free ports, a
produce that waits for room in the client's queue."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support import BrokerProcess  # noqa: E402 (needs the sys.path entry above)

MIB = 1024 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")

__all__ = [
    "MIB",
    "REPO",
    "BrokerProcess",
    "CpuByProcess",
    "Measure",
    "Sampler",
    "become_subreaper",
    "cmdline",
    "interrupt_on_sigterm",
    "leave_no_processes",
    "machine",
    "measure",
    "own_children",
    "pid_cpu_seconds",
    "produce_when_room",
    "reap_orphans",
    "stop_processes",
]


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


def pid_cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a live process (not its children), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15 of stat)


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
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.add(int(entry.name))
    return out


def own_children() -> set[int]:
    """The pids whose parent is this process (with ``become_subreaper``, adopted orphans too)."""
    return _children(os.getpid())


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except (OSError, ValueError, IndexError):
                continue
    return parents


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


class CpuByProcess(Sampler):
    """Samples the CPU time of a process tree (every ``interval`` s) and sums it per kind of
    process (``classify(cmdline) -> name``): where a multi-process job spends its CPU.
    A process that ends between two samples loses at most ``interval`` of CPU here."""

    def __init__(self, classify: Callable[[str], str], interval: float = 0.25) -> None:
        super().__init__(interval)
        self.classify = classify
        self.last: dict[int, tuple[str, float]] = {}
        self.root: int | None = None

    def start(self, root: int) -> None:
        self.root = root
        self.start_sampling()

    def sample(self) -> None:
        if self.root is None:
            return
        for pid in _tree({self.root}, _parents()):
            cmd = cmdline(pid)
            if cmd is None:
                continue
            # classified anew while it has a command line (exec changes it); a zombie has none
            kind = self.classify(cmd) if cmd.strip() or pid not in self.last else self.last[pid][0]
            self.last[pid] = (kind, pid_cpu_seconds(pid))

    def stop(self) -> dict[str, float]:
        self.stop_sampling()
        out: dict[str, float] = {}
        for kind, cpu in self.last.values():
            out[kind] = round(out.get(kind, 0.0) + cpu, 1)
        return out
