"""Triton with the bundled model as a container command, for a pod or a shell:

    python -m batchpilot.runtimes.triton.serve --host 0.0.0.0 --max-batch-size 4 \\
        --max-queue-delay-us 2000

writes the model repository into a temporary folder, runs `tritonserver` (explicit model
control, so BatchPilot can change batching live) in the foreground on the given address
and ports, passes SIGTERM and SIGINT on to it, and exits with its exit code once it has
stopped, the repository removed. The Triton runtime environment must be installed
(`scripts/runtimes triton`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from batchpilot.processes import run_in_foreground
from batchpilot.runtimes.base import LaunchError
from batchpilot.runtimes.triton.install import find_install
from batchpilot.runtimes.triton.process import server_args
from batchpilot.runtimes.triton.repository import TritonBatching, write_repository

DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
DEFAULT_METRICS_PORT = 8002


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m batchpilot.runtimes.triton.serve",
        description="Serve the bundled model on Triton with dynamic batching.",
    )
    p.add_argument("--host", default="0.0.0.0", help="address of every listener [0.0.0.0]")
    p.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
    p.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    p.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    p.add_argument("--max-batch-size", type=int, default=8, help="starting batch cap [8]")
    p.add_argument("--max-queue-delay-us", type=int, default=0, help="starting queue delay, µs [0]")
    p.add_argument("--instances", type=int, default=1, help="model instances [1]")
    p.add_argument(
        "--venv", type=Path, default=None, help="the Triton environment [the runtimes cache]"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for name in ("http_port", "grpc_port", "metrics_port"):
        if not 1 <= getattr(args, name) <= 65535:
            parser().error(f"--{name.replace('_', '-')} must be 1-65535")
    if args.instances < 1:
        parser().error("--instances must be at least 1")
    try:
        batching = TritonBatching(args.max_batch_size, args.max_queue_delay_us)
        install = asyncio.run(find_install(args.venv))
    except (ValueError, LaunchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="batchpilot-triton-"))
    try:
        write_repository(root, install, batching, instances=args.instances)
        command = server_args(
            install,
            root,
            host=args.host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
        )
        # Same process group as this one: whoever stops the group stops the python
        # backend's stubs with Triton.
        return run_in_foreground(command, env=install.environment(dict(os.environ)), cwd=root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
