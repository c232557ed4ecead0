"""The one way the broker serves an aiohttp application on a port of its own
(admin API, schema registry, Iceberg REST catalog)."""

from __future__ import annotations

import logging
import ssl

from aiohttp import web


class HttpService:
    """Mixin: set ``self.app`` in ``__init__``; ``start``/``close`` run it."""

    app: web.Application
    runner: web.AppRunner | None = None
    access_log: logging.Logger | None = None  # None: no access log lines
    ssl_context: ssl.SSLContext | None = None  # set: serve HTTPS (broker/http_security/tls.py)

    async def start(self, host: str, port: int) -> None:
        self.runner = web.AppRunner(self.app, access_log=self.access_log)
        await self.runner.setup()
        await web.TCPSite(self.runner, host, port, ssl_context=self.ssl_context).start()

    async def close(self) -> None:
        if self.runner:
            await self.runner.cleanup()
            self.runner = None
