"""`batchpilot load-worker`: serve load shares to the operator (a load-worker pod's
command; see loadgen.serve_worker)."""

from __future__ import annotations

import asyncio
import os

import click

from batchpilot.clitools import SeeHelpErrors, fail, on_interrupt
from batchpilot.loadgen.serve_worker import DEFAULT_PORT, TOKEN_ENV, serve_worker


@click.command(cls=SeeHelpErrors)
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="Port the operator sends shares to.",
)
@click.option(
    "--max-idle",
    type=click.FloatRange(0, None, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Exit (status 0) after this long without a share [default: never].",
)
def load_worker(host: str, port: int, max_idle: float | None) -> None:
    """Wait for shares of load steps from the operator and send them: each POST holds a
    share of one seeded schedule and its start time; the answer is the share's measured
    result. Requests must carry the bearer token in $BATCHPILOT_WORKER_TOKEN."""
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise fail(f"set {TOKEN_ENV} to the token the operator sends (the study's Secret)")

    async def main() -> None:
        stop = asyncio.Event()
        on_interrupt(stop.set)
        await serve_worker(token, host, port, stop, max_idle)

    try:
        asyncio.run(main())
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
