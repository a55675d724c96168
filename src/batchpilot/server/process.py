"""Run the reference server as a subprocess: what tests, benchmarks and the local tuner
use to get a real server on a loopback port and be sure it is gone afterwards."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import IO, NamedTuple

import aiohttp

from batchpilot.processes import (
    ChildProcess,
    NotReady,
    exit_code_of,
    free_port,
    read_tail,
    stop_process,
    wait_ready,
)

__all__ = ["ModelCrashes", "ServerProcess", "ServerStartError", "free_port"]

STDERR_TAIL_BYTES = 4000
_POLL_INTERVAL_S = 0.1
_PROBE_TIMEOUT_S = 2.0
_PORT_ATTEMPTS = 3


class ModelCrashes(NamedTuple):
    deaths: int  # model processes that died under the server since it started
    last: str  # how the last one ended, e.g. "was killed by SIGKILL"


class ServerStartError(RuntimeError):
    """The server did not become ready; the message carries the tail of its stderr."""


class ServerProcess(ChildProcess):
    """`async with ServerProcess(max_batch_size=16) as server: ... server.url ...`

    Starts `python -m batchpilot serve` on 127.0.0.1 and a free port, waits until
    GET /readyz answers 200 (warm-up done), and on exit sends SIGTERM, waits for the
    drain, then SIGKILL if the server has not gone. `env` is added to the environment
    the server inherits (e.g. {"MAX_BATCH_SIZE": "16"}, though the flags win)."""

    def __init__(
        self,
        *,
        model: str = "mlp",
        max_batch_size: int = 8,
        max_queue_time_ms: float = 5.0,
        threads: int | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = 120.0,
        stop_timeout_s: float = 15.0,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host
        self.port = free_port(host)
        self._args = [
            sys.executable,
            "-m",
            "batchpilot",
            "serve",
            "--host",
            host,
            "--port",
            str(self.port),
            "--model",
            model,
            "--max-batch-size",
            str(max_batch_size),
            "--max-queue-time-ms",
            str(max_queue_time_ms),
        ]
        if threads is not None:
            self._args += ["--threads", str(threads)]
        self._args += list(extra_args)
        # `env` adds to (and overrides) this process's environment rather than replacing it:
        # the child still needs PATH, HOME and the like.
        self._env = {**os.environ, **(env or {})}
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr: IO[bytes] | None = None
        self.returncode: int | None = None
        self._final_stderr = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("the server process has not been started")
        return self._proc.pid

    @property
    def args(self) -> list[str]:
        return list(self._args)

    async def start(self) -> None:
        """Start the server and wait until it is ready. A port taken by someone else
        between choosing and binding it is retried on a fresh port."""
        for attempt in range(_PORT_ATTEMPTS):
            try:
                await self._start_once()
                return
            except ServerStartError as exc:
                if "cannot listen on" not in str(exc) or attempt == _PORT_ATTEMPTS - 1:
                    raise
            self.port = free_port(self.host)
            self._args[self._args.index("--port") + 1] = str(self.port)

    async def _start_once(self) -> None:
        self.returncode = None
        # stderr goes to a temporary file rather than a pipe: nobody reads it while the
        # server runs, and a full pipe would block the server's logging.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        self._proc = await asyncio.create_subprocess_exec(
            *self._args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=self._stderr,
            env=self._env,
        )
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise

    async def _wait_ready(self) -> None:
        assert self._proc is not None
        try:
            await wait_ready(
                self._proc,
                f"{self.url}/readyz",
                timeout_s=self._ready_timeout_s,
                poll_s=_POLL_INTERVAL_S,
                probe_timeout_s=_PROBE_TIMEOUT_S,
            )
        except NotReady as exc:
            if exc.returncode is not None:
                raise ServerStartError(
                    f"the server exited with code {exc.returncode} before it was "
                    f"ready ({' '.join(self._args[2:])}); stderr:\n{self.stderr_tail()}"
                ) from None
            raise ServerStartError(
                f"the server on {self.url} was not ready within "
                f"{self._ready_timeout_s:g} s; stderr:\n{self.stderr_tail()}"
            ) from None

    def send_signal(self, sig: int) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.send_signal(sig)

    async def exit_code(self, grace_s: float = 0.0) -> int | None:
        """The exit code when the process has exited (waiting up to `grace_s` for the
        event loop to notice), None while it runs."""
        if self._proc is None:
            return None
        return await exit_code_of(self._proc, grace_s)

    async def model_crashes(self) -> ModelCrashes | None:
        """How many model processes died under the server since it started, and how the
        last one ended (its /healthz); None when the server does not answer."""
        timeout = aiohttp.ClientTimeout(total=_PROBE_TIMEOUT_S)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(f"{self.url}/healthz") as response,
            ):
                body = await response.json()
            report = body["model_process"]
            return ModelCrashes(deaths=int(report["crashes"]), last=str(report["last"]))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
            return None

    async def restart(self) -> None:
        """Stop the process (if it still runs) and start it again with the same flags."""
        await self.stop()
        await self.start()

    async def wait(self, timeout_s: float) -> int:
        """Wait for the process to exit on its own; its exit code."""
        assert self._proc is not None
        self.returncode = await asyncio.wait_for(self._proc.wait(), timeout_s)
        return self.returncode

    async def stop(self) -> None:
        """SIGTERM (the server drains in-flight requests), then SIGKILL after the grace."""
        proc = self._proc
        if proc is None:
            return
        try:
            self.returncode = await stop_process(proc, self._stop_timeout_s)
        finally:
            if self._stderr is not None:
                # Keep the log's tail: tests read what the server said while draining.
                self._final_stderr = read_tail(self._stderr, STDERR_TAIL_BYTES)
                self._stderr.close()
                self._stderr = None

    def stderr_tail(self, limit: int = STDERR_TAIL_BYTES) -> str:
        """The last `limit` bytes the server wrote to stderr (its log), also after exit."""
        if self._stderr is None:
            return self._final_stderr[-limit:]
        return read_tail(self._stderr, limit)
