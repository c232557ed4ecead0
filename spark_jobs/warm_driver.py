"""A warm round driver: one long-lived SparkSession that runs commit rounds on request.

A round through spark-submit starts a JVM (and, for a large round, a SparkContext and its
Python workers) each time: seconds of CPU on every round, which on two shared cores bounds the
rate a table topic can sustain. This process starts Spark once (the same jars and settings as a
round started from Python, ``commit_round.spark_session``) and runs each requested round with
``commit_round.run(argv, spark=session)``: the same code path, the same result JSON and the
same exactly-once publish (the round's offsets go in the round's Iceberg commit) as
``spark-submit spark_jobs/commit_round.py``.

Transport: HTTP on loopback only, every request carrying ``Authorization: Bearer <token>`` with
the token from ``ICEFALL_WARM_DRIVER_TOKEN`` (required). Spark Connect is not an option: the
round uses the SparkContext and the JVM gateway (``run_tasks``, Glue's credentials), which a
Spark Connect client has not got.

The driver listens at once, then starts Spark and warms up (``spark_jobs.warm_up``: a Python
worker started on every core, the round's JVM code run once); until it is warm every request
gets 503 with ``{"status": "starting"}``, so a health check answered 200 means warm (the first
round does not pay the Python workers' start, which made a new driver's first Spark round 3-4
times as slow as the next ones). A commit task that finds the driver starting waits for it
(``icefall_airflow.warm_driver``) instead of running the round itself: on two cores a second
JVM (or a round's Python process) starting beside the warming one slowed both, and at
``icefall up``'s start a table topic's first round used to pay it. Its workers fork from
``spark_jobs.worker_daemon``, which has the tasks' modules imported, so workers Spark replaces
after a minute idle start warm too. A start that is not warm within ``STARTUP_DEADLINE_S``
(300 s) exits (code 4), so that its supervisor starts a fresh one rather than the driver
answering "starting" for ever.

* ``GET /v1/health`` -> ``{"status": "ok", "rounds": <rounds run>, "warm_up": <WarmUp>,
  "prestaged_records": {<topic>: <records written ahead>}}``
  (also checks the JVM), or 503 ``{"status": "starting", "error": ...}`` while it warms up;
* ``POST /v1/commit-rounds`` with a ``WarmRoundRequest`` (the round's command-line arguments,
  as the Airflow task builds them for spark-submit, and the credentials environment
  ``icefall_airflow.credentials.job_env`` gives spark-submit) -> a ``WarmRoundReply`` (the
  exit code spark-submit would have, the result JSON). A bad request gets 400 with the reason.
* ``POST /v1/prestage`` with a ``WarmRoundRequest`` for a round whose interval has not ended
  (``--until-append-time``) -> 202 ``{"status": ...}`` at once: the driver starts writing that
  round's rows as the broker flushes them, and the round, when it comes, takes what it can
  use (``spark_jobs.prestage``).

Rounds of one table topic run one at a time (a second waits for the first); rounds of
different topics run at once. The credentials are applied to this process's environment for
the round (the round reads them there, as under spark-submit); a round whose credentials
differ from those of rounds running now waits for them to finish. A round that finds the JVM
gone exits this process (code 3) so that its supervisor (``icefall up``) starts a fresh one.

    ICEFALL_WARM_DRIVER_TOKEN=... python -m spark_jobs.warm_driver --port 8094 --ready-file /tmp/ready
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from broker import log_setup
from broker.http_security.client import CREDENTIAL_ENVS
from spark_jobs.warm_up import WarmUp, warm_up

if TYPE_CHECKING:
    from spark_jobs.prestage import Prestager

log = logging.getLogger("icefall.warm_driver")
TOKEN_ENV = "ICEFALL_WARM_DRIVER_TOKEN"
ROUNDS_PATH = "/v1/commit-rounds"
PRESTAGE_PATH = "/v1/prestage"
HEALTH_PATH = "/v1/health"
MAX_BODY = 1 << 20
JVM_GONE_EXIT = 3
NOT_WARM_EXIT = 4
# Spark's start and the warm-up take 20-80 s on two busy cores (a commit task waits up to
# 180 s for a starting driver, then runs the round itself)
STARTUP_DEADLINE_S = 300.0
DAEMON_CONF = "spark.python.daemon.module"
# Flags that would change the process, not the round: the driver's session is the one to use.
REFUSED_FLAGS = ("--result", "--master", "--log-level")


class WarmRoundRequest(BaseModel):
    """One round: ``spark_jobs/commit_round.py``'s arguments and the credentials' environment."""

    model_config = ConfigDict(extra="forbid")

    args: list[str]
    env: dict[str, str] = {}


class WarmRoundReply(BaseModel):
    """The round's exit code (0 committed / nothing new, 1 failed) and its result JSON."""

    model_config = ConfigDict(extra="ignore")

    exit_code: int
    result: dict[str, Any]


class BadRequest(ValueError):
    """The request cannot be a round; the message says why."""


class CredentialGate:
    """Rounds run with the credentials of their request in this process's environment; rounds
    with other credentials than those applied wait until the running ones are done."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._waiting = 0  # rounds waiting for the running ones' credentials to be done
        self._applied: dict[str, str] | None = None
        self._started_with = {k: os.environ[k] for k in CREDENTIAL_ENVS if k in os.environ}

    def _enter(self, wanted: dict[str, str]) -> None:
        """Apply ``wanted`` (held: ``_cond``, and nothing running with other credentials)."""
        if wanted != self._applied:
            for key in CREDENTIAL_ENVS:
                if key in wanted:
                    os.environ[key] = wanted[key]
                else:
                    os.environ.pop(key, None)
            self._applied = wanted
        self._running += 1

    def _leave(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    @contextmanager
    def credentials(self, env: dict[str, str]) -> Iterator[None]:
        wanted = {**self._started_with, **env}
        with self._cond:
            self._waiting += 1
            try:
                while self._running and wanted != self._applied:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._enter(wanted)
        try:
            yield
        finally:
            self._leave()

    @contextmanager
    def credentials_now(self, env: dict[str, str]) -> Iterator[bool]:
        """``credentials`` without the wait: False (nothing applied) while rounds with other
        credentials run, or wait to. A pre-stage's step must not wait (the round it serves may
        be one of them, and takes its rows by stopping it), nor keep a waiting round waiting."""
        wanted = {**self._started_with, **env}
        with self._cond:
            if self._waiting or (self._running and wanted != self._applied):
                entered = False
            else:
                self._enter(wanted)
                entered = True
        if not entered:
            yield False
            return
        try:
            yield True
        finally:
            self._leave()


class WarmDriver:
    """The session, the per-topic locks and the count of rounds run."""

    def __init__(self, spark: Any, warmed: WarmUp | None = None) -> None:
        self.spark = spark
        self.warmed = warmed
        self.rounds = 0
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._gate = CredentialGate()
        from spark_jobs.prestage import Prestager  # pyarrow and the decoders: not for clients

        self.prestager: Prestager = Prestager(self._gate.credentials_now, self._topic_lock)

    def _topic_lock(self, topic: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(topic, threading.Lock())

    def jvm_alive(self) -> bool:
        try:
            return not self.spark.sparkContext._jsc.sc().isStopped()
        except Exception:  # noqa: BLE001 -- the gateway is gone: the JVM died
            return False

    def _args(self, request: WarmRoundRequest) -> argparse.Namespace:
        """The request's round arguments, parsed; ``BadRequest`` for what it may not carry."""
        from spark_jobs import commit_round

        if bad := [a for a in request.args if a.split("=", 1)[0] in REFUSED_FLAGS]:
            raise BadRequest(f"the warm driver sets {', '.join(bad)} itself; leave it out")
        # the only variables a request may set: what ``credentials.job_env`` gives spark-submit
        if unknown := sorted(set(request.env) - set(CREDENTIAL_ENVS)):
            raise BadRequest(f"env may only set {', '.join(CREDENTIAL_ENVS)}, not {unknown}")
        try:
            args = commit_round.parse_args(request.args)
        except SystemExit as exc:  # argparse printed the reason on stderr
            raise BadRequest(
                f"not commit_round arguments: {request.args} (exit {exc.code})"
            ) from exc
        # commit_round's parser takes no abbreviations (``--mast`` is no ``--master``); the
        # parsed values say it again, whatever spelling reached them
        if set_anyway := [
            flag
            for flag, value in (("--master", args.master), ("--result", args.result))
            if value is not None
        ]:
            raise BadRequest(f"the warm driver sets {', '.join(set_anyway)} itself; leave it out")
        return args

    def prestage(self, request: WarmRoundRequest) -> str:
        """Start writing the round's rows ahead (``spark_jobs.prestage``); what it did."""
        try:
            return self.prestager.start(self._args(request), request.env)
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc

    def run_round(self, request: WarmRoundRequest) -> WarmRoundReply:
        from spark_jobs import commit_round

        args = self._args(request)
        with self._topic_lock(args.topic):
            staged = self.prestager.take(args.topic)  # the round uses them or drops them
            with self._gate.credentials(request.env):
                code, result = commit_round.run(request.args, spark=self.spark, staged=staged)
            with self._guard:
                self.rounds += 1
        if code != 0 and not self.jvm_alive():
            log.error(
                "the Spark JVM is gone; exiting for a fresh start (round: %s)", result.message
            )
            self._reply_then_exit()
        return WarmRoundReply(exit_code=code, result=result.to_json())

    def _reply_then_exit(self) -> None:
        """Exit shortly after this round's reply is sent (its task sees the failure first)."""
        threading.Timer(1.0, os._exit, args=(JVM_GONE_EXIT,)).start()


class DriverSlot:
    """What the HTTP handler serves: the driver once it is warm, None while Spark starts."""

    def __init__(self, driver: WarmDriver | None = None) -> None:
        self.driver = driver


STARTING = "the warm driver is starting (Spark and its Python workers warming up)"
STARTING_ANSWER = (HTTPStatus.SERVICE_UNAVAILABLE, {"status": "starting", "error": STARTING})


def validation_message(exc: ValidationError) -> str:
    """Where and what is wrong in a request, without the values: the body carries credentials,
    and the client raises this message into the task's log."""
    problems = [
        f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}"
        for error in exc.errors(include_input=False, include_url=False, include_context=False)
    ]
    return f"not a WarmRoundRequest: {'; '.join(problems)}"


def health_answer(slot: DriverSlot) -> tuple[HTTPStatus, dict[str, Any]]:
    driver = slot.driver
    if driver is None:
        return STARTING_ANSWER
    if not driver.jvm_alive():
        return HTTPStatus.SERVICE_UNAVAILABLE, {"error": "the Spark JVM is gone"}
    warmed = driver.warmed.model_dump() if driver.warmed else None
    return HTTPStatus.OK, {
        "status": "ok",
        "rounds": driver.rounds,
        "warm_up": warmed,
        "prestaged_records": driver.prestager.status(),
    }


def round_answer(
    slot: DriverSlot, content_length: str, body: Any, path: str = ROUNDS_PATH
) -> tuple[HTTPStatus, dict[str, Any]]:
    """The answer to a round request (or with ``path`` ``PRESTAGE_PATH``, a pre-stage request)
    whose body (``content_length`` bytes) is read from the file ``body``."""
    driver = slot.driver
    if driver is None:
        return STARTING_ANSWER
    try:
        length = int(content_length)
        if not 0 < length <= MAX_BODY:
            raise BadRequest(f"a request body of 1 to {MAX_BODY} bytes, not {length}")
        request = WarmRoundRequest.model_validate_json(body.read(length))
        if path == PRESTAGE_PATH:
            return HTTPStatus.ACCEPTED, {"status": driver.prestage(request)}
        reply = driver.run_round(request)
    except ValidationError as exc:
        return HTTPStatus.BAD_REQUEST, {"error": validation_message(exc)}
    except (BadRequest, ValueError) as exc:
        return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
    return HTTPStatus.OK, reply.model_dump(mode="json")


def handler(target: WarmDriver | DriverSlot, token: str) -> type[BaseHTTPRequestHandler]:
    slot = target if isinstance(target, DriverSlot) else DriverSlot(target)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            given = self.headers.get("Authorization", "")
            if secrets.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return True
            self._send(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"})
            return False

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path != HEALTH_PATH:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path}"})
            else:
                self._send(*health_answer(slot))

        def do_POST(self) -> None:
            if not self._authorized():
                return
            if self.path not in (ROUNDS_PATH, PRESTAGE_PATH):
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path}"})
                return
            length = self.headers.get("Content-Length", "0")
            self._send(*round_answer(slot, length, self.rfile, self.path))

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return Handler


def _not_warm_in_time() -> None:
    log.error("not warm within %.0f s; exiting for a fresh start", STARTUP_DEADLINE_S)
    os._exit(NOT_WARM_EXIT)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="warm_driver", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="loopback port to listen on")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--ready-file", type=Path, help="written once warm and the port is open")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_setup.configure(args.log_level)
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        print(f"warm_driver: set {TOKEN_ENV} (the token every request must carry)", file=sys.stderr)
        return 2
    from spark_jobs.commit_round import spark_session

    # listen first: until warm, requests get 503 "starting" (a round waits), not a refusal
    # (a round would run in a process of its own beside the warming driver)
    slot = DriverSlot()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(slot, token))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="warm-driver-http", daemon=True).start()
    log.info("warm round driver on 127.0.0.1:%d: starting Spark", args.port)
    # a start that never gets warm (a cluster master without free workers: the warm-up job
    # waits for resources) exits, so the supervisor starts a fresh one, rather than answering
    # "starting" for ever while every round waits its RESTART_WAIT_S before falling back
    give_up = threading.Timer(STARTUP_DEADLINE_S, _not_warm_in_time)
    give_up.daemon = True
    give_up.start()
    spark = None
    try:
        spark = spark_session(
            "icefall-warm-round-driver", args.master, {DAEMON_CONF: "spark_jobs.worker_daemon"}
        )
        slot.driver = WarmDriver(spark, warm_up(spark))
        give_up.cancel()
        if args.ready_file is not None:
            args.ready_file.write_text(f"{os.getpid()}\n")
        log.info("warm round driver on 127.0.0.1:%d (Spark %s): warm", args.port, spark.version)
        threading.Event().wait()  # serve until Ctrl-C (SIGTERM ends the process at once)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
        if spark is not None:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
