"""A real headless Chromium, driven over the Chrome DevTools Protocol (CDP), for the UI tests.

Debian's ``chromium`` (``make system-deps``) started with ``--remote-debugging-port=0``; its
page is driven through CDP's JSON-over-WebSocket commands with the ``websockets`` package
already pinned (no WebDriver, no chromium-driver, no Selenium). Enough for what the tests
do: navigate, type into a form as a user does (``Input.insertText`` into the focused field),
read the DOM and take a PNG screenshot. The browser runs in its own process group and is
killed at exit.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from websockets.sync.client import ClientConnection, connect

from tests.support import wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium with one page (a tab), profile in ``profile``."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 900) -> None:
        assert CHROMIUM is not None, "Debian's chromium is not installed"
        self.tmp = tempfile.mkdtemp(prefix="icefall-chromium-")
        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            # killed (close), chromium leaves its org.chromium.Chromium.* directory behind: they
            # gathered in /tmp. So a directory of its own, which close removes; under /tmp, not in
            # the test's profile: there chromium never wrote its DevTools port (a path too long for
            # its sockets, it seems).
            env={**os.environ, "TMPDIR": self.tmp},
        )
        self.ids = itertools.count(1)
        self.ws: ClientConnection | None = None
        try:
            active = profile / "DevToolsActivePort"  # chromium writes its port here
            port = wait_for(
                lambda: active.exists() and active.read_text().split("\n")[0].strip(),
                60,
                what="chromium's DevTools port",
            )
            targets = json.loads(
                urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read()
            )
            [page] = [t for t in targets if t["type"] == "page"]
            self.ws = connect(page["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024)
            self.send("Page.enable")
            self.send("Runtime.enable")
        except BaseException:
            self.close()
            raise

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """A CDP command and its result (events arriving meanwhile are skipped)."""
        assert self.ws is not None
        call = next(self.ids)
        self.ws.send(json.dumps({"id": call, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == call:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    def evaluate(self, expression: str) -> Any:
        """A JavaScript expression's value in the page."""
        answer = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def location(self) -> str:
        return str(self.evaluate("document.readyState === 'complete' ? location.href : ''"))

    def type_into(self, selector: str, text: str) -> None:
        """Focus the field and type ``text`` into it (input events, as from a keyboard)."""
        assert self.evaluate(
            f"(e => e ? (e.focus(), document.activeElement === e) : false)"
            f"(document.querySelector({json.dumps(selector)}))"
        ), f"no field {selector}"
        self.send("Input.insertText", text=text)

    def dom(self) -> str:
        return str(self.evaluate("document.documentElement.outerHTML"))

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def close(self) -> None:
        """Kill chromium's whole process group (its renderers and helpers outlive the main
        process), whatever state the DevTools socket is in."""
        try:
            if self.ws is not None:
                self.ws.close()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
