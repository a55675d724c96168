"""vLLM's CPU engine as a container command, for a pod or a shell:

    python -m batchpilot.runtimes.vllm.serve --host 0.0.0.0 --port 8000 \\
        --max-num-seqs 8 --max-num-batched-tokens 512 [--model-dir DIR]

serves DIR (a model folder vLLM loads), or else the tiny random-weight model written into
a temporary folder first, with `VllmProcess`'s command line and environment (without
vLLM's development endpoints) on the given address, in the foreground; passes SIGTERM
and SIGINT on to it and exits with its exit code once it has stopped, the temporary model
removed. The engine's environment must be installed (`scripts/engines vllm`)."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from batchpilot.processes import run_in_foreground
from batchpilot.runtimes.base import LaunchError
from batchpilot.runtimes.vllm.knobs import DEFAULT_TOKEN_BUDGET, VllmKnobs
from batchpilot.runtimes.vllm.process import MODEL, VllmProcess, engine_python, write_tiny_model

DEFAULT_PORT = 8000


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m batchpilot.runtimes.vllm.serve",
        description="Serve a model on vLLM's CPU engine with continuous batching.",
    )
    p.add_argument("--host", default="0.0.0.0", help="listen address [0.0.0.0]")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"[{DEFAULT_PORT}]")
    p.add_argument("--max-num-seqs", type=int, default=8, help="the batch cap [8]")
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=DEFAULT_TOKEN_BUDGET,
        help=f"the token budget of a step [{DEFAULT_TOKEN_BUDGET}]",
    )
    p.add_argument("--model-dir", type=Path, default=None, help="[the tiny model, written]")
    p.add_argument("--served-model-name", default=MODEL, help=f"[{MODEL}]")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of the engine [1]")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not 1 <= args.port <= 65535:
        parser().error("--port must be 1-65535")
    try:
        knobs = VllmKnobs(
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens
        )
        python = engine_python()
    except (ValueError, LaunchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="batchpilot-vllm-serve-"))
    try:
        model_dir = args.model_dir
        if model_dir is None:
            model_dir = asyncio.run(write_tiny_model(root / MODEL))
        server = VllmProcess(model_dir, knobs, model=args.served_model_name, threads=args.threads)
        server.host = args.host
        server.ports = {"http": args.port}
        server.root = root
        env = server.environment()
        # development endpoints (weights, sleep, cache resets) only on the loopback-only
        # servers `tune --local` starts, never on an address others reach
        env.pop("VLLM_SERVER_DEV_MODE", None)
        # the engine core stops with the API server: one process group
        return run_in_foreground([str(python), *server.args()], env=env, cwd=root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
