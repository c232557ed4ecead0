"""The freshness alert's webhook failing: the alert is still logged, and the webhook's URL (whose
path is the secret of Slack- or Teams-style webhooks) is not, only its host."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import threading

import pytest

from tests.support import free_port


class _Refusing(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(403)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_failing_webhook_is_logged_by_host_only(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from icefall_airflow import freshness

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secret = "T0000/B0000/s3cr3tw3bh00k"
    try:
        for url, why in (
            (f"http://127.0.0.1:{server.server_address[1]}/services/{secret}", "HTTP 403"),
            (f"http://127.0.0.1:{free_port()}/services/{secret}", "ConnectionRefusedError"),
        ):
            monkeypatch.setenv(freshness.WEBHOOK_ENV, url)
            caplog.clear()
            with caplog.at_level(logging.INFO, logger=freshness.__name__):
                event = json.loads(
                    asyncio.run(
                        freshness.freshness_deadline_missed("late", "default", "late", 1000)
                    )
                )
            assert event["topic"] == "late"
            text = caplog.text
            assert "missed its freshness SLA" in text  # the alert itself, logged either way
            assert "webhook on 127.0.0.1 failed" in text and why in text, text
            assert "s3cr3t" not in text and "/services/" not in text
    finally:
        server.shutdown()
        server.server_close()


def test_a_webhook_that_is_no_url_is_named_not_echoed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """urllib refuses it with a ValueError (it used to crash the callback in the triggerer)."""
    from icefall_airflow import freshness

    monkeypatch.setenv(freshness.WEBHOOK_ENV, "hooks.example/s3cr3t")
    with caplog.at_level(logging.INFO, logger=freshness.__name__):
        event = json.loads(
            asyncio.run(freshness.freshness_deadline_missed("late", "default", "late", 1000))
        )
    assert event["topic"] == "late"
    assert "missed its freshness SLA" in caplog.text
    assert "ICEFALL_FRESHNESS_WEBHOOK_URL is not an http(s) URL" in caplog.text, caplog.text
    assert "s3cr3t" not in caplog.text
