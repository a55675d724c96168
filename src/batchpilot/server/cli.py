"""`batchpilot serve`: flags and environment variables of the reference server.

PyTorch is imported only once the command runs, so `batchpilot --help` stays fast."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import click

from batchpilot.clitools import OneLineErrors
from batchpilot.extras import torch_missing
from batchpilot.models import MAX_BATCH_SIZE_LIMIT, MAX_QUEUE_TIME_MS_LIMIT

MODELS = ("mlp", "encoder")


def _default_threads() -> int:
    from batchpilot.server.engine import default_threads

    return default_threads()


@click.command(cls=OneLineErrors)
@click.option(
    "--host",
    envvar="HOST",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on [env HOST].",
)
@click.option(
    "--port",
    envvar="PORT",
    type=click.IntRange(1, 65535),
    default=8080,
    show_default=True,
    help="TCP port [env PORT].",
)
@click.option(
    "--model",
    type=click.Choice(MODELS),
    default="mlp",
    show_default=True,
    help="Built-in model: mlp (rows of features) or encoder (token sequences).",
)
@click.option(
    "--device",
    type=click.Choice(("cpu", "cuda", "auto")),
    default="cpu",
    show_default=True,
    help="Where the model runs; auto picks CUDA when present.",
)
@click.option(
    "--threads",
    type=click.IntRange(1, 1024),
    default=None,
    help="Torch threads [default: usable cores - 1, at least 1].",
)
@click.option(
    "--max-batch-size",
    envvar="MAX_BATCH_SIZE",
    type=click.IntRange(1, MAX_BATCH_SIZE_LIMIT),
    default=8,
    show_default=True,
    help="Most requests in one batch [env MAX_BATCH_SIZE].",
)
@click.option(
    "--max-queue-time-ms",
    envvar="MAX_QUEUE_TIME_MS",
    type=click.FloatRange(0.0, MAX_QUEUE_TIME_MS_LIMIT),
    default=5.0,
    show_default=True,
    help="Longest wait for a batch to fill, from its first request [env MAX_QUEUE_TIME_MS].",
)
@click.option(
    "--queue-limit",
    type=click.IntRange(1, 1_000_000),
    default=1024,
    show_default=True,
    help="Most requests waiting; beyond it 503 + Retry-After.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(1024, 1 << 30),
    default=8 << 20,
    show_default=True,
    help="Largest request body accepted.",
)
@click.option(
    "--drain-timeout-s",
    type=click.FloatRange(0.0, 3600.0),
    default=30.0,
    show_default=True,
    help="On SIGTERM, longest wait for in-flight requests.",
)
@click.option(
    "--log-level",
    type=click.Choice(("debug", "info", "warning", "error")),
    default="info",
    show_default=True,
)
def serve(**kwargs: Any) -> None:  # fmt: skip
    """Run the reference inference server with dynamic batching."""
    missing = torch_missing("batchpilot serve (the reference server)")
    if missing is not None:
        raise click.ClickException(missing)
    logging.basicConfig(
        level=kwargs["log_level"].upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Imported here: these pull in PyTorch.
    from batchpilot.models import BatchingConfig
    from batchpilot.server.app import ServerOptions
    from batchpilot.server.runner import ServeError, ServeSettings
    from batchpilot.server.runner import serve as run_server

    settings = ServeSettings(
        host=kwargs["host"],
        port=kwargs["port"],
        model=kwargs["model"],
        device=kwargs["device"],
        threads=kwargs["threads"] or _default_threads(),
        drain_timeout_s=kwargs["drain_timeout_s"],
        options=ServerOptions(
            batching=BatchingConfig(
                max_batch_size=kwargs["max_batch_size"],
                max_queue_time_ms=kwargs["max_queue_time_ms"],
            ),
            queue_limit=kwargs["queue_limit"],
            max_body_bytes=kwargs["max_body_bytes"],
        ),
    )
    try:
        asyncio.run(run_server(settings))
    except ServeError as exc:
        raise click.ClickException(str(exc)) from None
