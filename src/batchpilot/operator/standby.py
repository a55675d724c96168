"""A replica that does not hold the Lease stands by before Kopf watches anything.

Kopf, once it processes a resource, writes to it on its own: it adds its finalizer,
stores the last handled spec and records handler progress in annotations. Handlers that
check the election cannot stop those writes, so a standby waits in Kopf's startup,
before any watch begins, until it leads. Kopf serves its liveness probe only after
startup, so the standby answers the probe itself meanwhile: a kubelet must not restart
a replica for standing by. For the same reason a leader that loses the Lease stops
Kopf altogether (`stop_when_deposed`): restarted, it stands by again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import urlparse

from aiohttp import web

from batchpilot.operator.leader import Elector, Leadership

log = logging.getLogger(__name__)

# how often a standby says it still stands by
REPORT_S = 60.0


def liveness_address(url: str) -> tuple[str, int, str]:
    """(host, port, path) of a liveness URL, read as Kopf reads it."""
    parts = urlparse(url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"liveness URL {url!r} needs a host and a port")
    return parts.hostname, parts.port, parts.path or "/"


async def _serve_liveness(url: str) -> web.AppRunner:
    host, port, path = liveness_address(url)

    async def alive(_: web.Request) -> web.Response:
        return web.json_response({"standby": True})

    app = web.Application()
    app.router.add_get(path, alive)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def stand_by(
    elector: Elector,
    election: asyncio.Task[None],
    liveness_url: str,
    report_s: float = REPORT_S,
) -> None:
    """Return once `elector` leads; until then answer the liveness probe at
    `liveness_url` (none when empty). `election` runs `elector`: cancelled while
    standing by, this ends it, as Kopf runs no cleanup after a startup cut short."""
    runner = await _serve_liveness(liveness_url) if liveness_url else None
    identity = elector.settings.identity
    try:
        while not await elector.wait_leader(report_s):
            log.info(f"{identity} stands by: another replica holds the lease")
    except asyncio.CancelledError:
        election.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await election
        await elector.close()
        raise
    finally:
        if runner is not None:
            # freed before Kopf's own probe binds the same address
            await runner.cleanup()


async def stop_when_deposed(leadership: Leadership, stop: asyncio.Event) -> None:
    """Set `stop` (Kopf's stop flag) once `leadership`, held now, is lost. The study
    daemon has then cancelled its step already; this ends the watches too."""
    await leadership.wait_lost()
    log.error("the lease was lost: stopping, so that the restarted replica stands by")
    stop.set()
