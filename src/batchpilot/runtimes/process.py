"""What every runtime started on this machine shares (`tune --local --runtime NAME`): one
child process in a session and process group of its own, its output in a temporary file
(nobody reads it while the server runs), a temporary folder, a stop that ends every
process it started and removes the folder, a restart on the same ports, its exit code
and the tail of its log, also after it exited. A runtime says how it starts (`start`) and,
where signalling its process group is not enough, how it ends (`_terminate`)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, ClassVar

from batchpilot.processes import (
    ChildProcess,
    NotReady,
    exit_code_of,
    free_ports,
    read_tail,
    signal_group,
    wait_ready,
)
from batchpilot.runtimes.base import LaunchError

LOG_TAIL_BYTES = 4000
HOST = "127.0.0.1"
PORT_ATTEMPTS = 3
# How the runtimes' servers say a port was taken: gRPC's core, asyncio/uvicorn's errno 98,
# Java's BindException, Go's net.Listen, Ray's own checks.
_PORT_TAKEN = (
    "already in use",
    "address in use",
    "failed to bind",
    "eaddrinuse",
    "bindexception",
    "bind: address",
)


def port_taken(message: str) -> bool:
    """Whether a failed start's message (its log's tail) says a port was already taken."""
    lowered = message.lower()
    return any(phrase in lowered for phrase in _PORT_TAKEN)


class RuntimeProcess(ChildProcess):
    """A runtime's server on this machine; `what` names it in messages ("Triton"). Every
    port it listens on (`port_names`) is chosen free on 127.0.0.1 at its first start and
    kept by a restart (clients hold its URL)."""

    what: ClassVar[str]
    port_names: ClassVar[tuple[str, ...]]
    inference_port: ClassVar[str]  # the port of `url`
    metrics_port_name: ClassVar[str]  # the port of `metrics_url`

    def __init__(
        self, *, threads: int | None, ready_timeout_s: float, stop_timeout_s: float
    ) -> None:
        self.host = HOST
        self.threads = threads
        self.ports: dict[str, int] = {}
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None
        self._final_log = ""
        self.root: Path | None = None  # the temporary folder
        self.returncode: int | None = None  # once stopped

    def address(self, port: str) -> str:
        """http://127.0.0.1:PORT of the port named `port`."""
        if not self.ports:
            raise RuntimeError(f"{self.what} has not been started")
        return f"http://{self.host}:{self.ports[port]}"

    def _choose_ports(self) -> None:
        self.ports = dict(
            zip(self.port_names, free_ports(len(self.port_names), self.host), strict=True)
        )

    async def _start_on_ports(
        self,
        start_once: Callable[[], Awaitable[None]],
        retry_on: Callable[[str], bool] = port_taken,
    ) -> None:
        """`start_once` (which stops what it started when it fails) on this server's ports.
        A first start chooses them, and chooses again, up to PORT_ATTEMPTS starts in all,
        when the server says one was taken: a port is free when chosen, and on a shared
        machine another process may bind it before the server does. A restart keeps its
        ports and is not retried on others: clients hold its URL, and another server may
        now answer there. `retry_on` tells a failed start's message worth another start
        (default: a port taken)."""
        first = not self.ports
        for attempt in range(1, PORT_ATTEMPTS + 1):
            if first:
                self._choose_ports()
            try:
                await start_once()
                return
            except LaunchError as exc:
                if not first:
                    raise
                if attempt == PORT_ATTEMPTS or not retry_on(str(exc)):
                    self.ports = {}  # nothing listens there: a next start is a first one
                    raise

    @property
    def url(self) -> str:
        """The inference base URL."""
        return self.address(self.inference_port)

    @property
    def metrics_url(self) -> str:
        """Where its Prometheus metrics are served."""
        return self.address(self.metrics_port_name) + "/metrics"

    @property
    def pid(self) -> int:
        """The process BatchPilot started: leader of its session and process group."""
        if self._proc is None:
            raise RuntimeError(f"{self.what} has not been started")
        return self._proc.pid

    async def _new_root(self, prefix: str, parent: str | None = None) -> Path:
        """A fresh temporary folder (the one of a previous start removed)."""
        await self._remove_root()
        self.root = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        return self.root

    async def _remove_root(self) -> None:
        if self.root is not None:
            await asyncio.to_thread(shutil.rmtree, self.root, True)
            self.root = None

    async def _spawn(
        self, args: Sequence[str], *, env: Mapping[str, str], cwd: Path
    ) -> asyncio.subprocess.Process:
        """Start `args` in a session of its own, stdout and stderr into the log file."""
        self.returncode = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        self._proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._log,
            stderr=asyncio.subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
        return self._proc

    def not_ready(self, exc: NotReady) -> str:
        """What a start that did not become ready says: "exited with code 1", "was not
        ready within 60 s"."""
        if exc.returncode is not None:
            return f"exited with code {exc.returncode}"
        return f"was not ready within {self._ready_timeout_s:g} s"

    async def _wait_ready(
        self,
        url: str,
        *,
        poll_s: float,
        error: type[LaunchError] = LaunchError,
        tail: int = LOG_TAIL_BYTES,
    ) -> None:
        """Until GET `url` answers 200; `error` with the tail of the log when the process
        exits first or the ready timeout passes."""
        assert self._proc is not None
        try:
            await wait_ready(self._proc, url, timeout_s=self._ready_timeout_s, poll_s=poll_s)
        except NotReady as exc:
            raise error(
                f"{self.what} {self.not_ready(exc)} (on {url}); its log:\n{self.stderr_tail(tail)}"
            ) from None

    async def _terminate(self, proc: asyncio.subprocess.Process) -> None:
        """End `proc` and every process it started; return once `proc` has exited. Here:
        SIGTERM to the process group, SIGKILL to it after the stop timeout, and SIGKILL
        to whatever of the group outlived its leader."""
        if proc.returncode is None:
            signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self._stop_timeout_s)
            except TimeoutError:
                signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
        signal_group(proc.pid, signal.SIGKILL)

    async def _end_process(self) -> None:
        """End the process (if it was started), keep its exit code and its log's tail."""
        proc = self._proc
        if proc is None:
            return
        try:
            await self._terminate(proc)
            self.returncode = proc.returncode
        finally:
            self._proc = None
            if self._log is not None:
                self._final_log = read_tail(self._log, LOG_TAIL_BYTES)
                self._log.close()
                self._log = None

    async def stop(self) -> None:
        """End every process of the server and remove the temporary folder."""
        await self._end_process()
        await self._remove_root()

    async def restart(self) -> None:
        """End the server (if it still runs) and start it again on the same ports at its
        starting configuration (a live change does not survive a restart)."""
        await self._end_process()
        await self.start()

    async def exit_code(self, grace_s: float = 0.0) -> int | None:
        """The exit code once the server has exited (waiting up to `grace_s`), None while
        it runs."""
        if self._proc is None:
            return self.returncode
        return await exit_code_of(self._proc, grace_s)

    def stderr_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        """The end of the server's output (stdout and stderr), also after it exited."""
        if self._log is None:
            return self._final_log[-limit:]
        return read_tail(self._log, limit)


class V2Process(RuntimeProcess):
    """A KServe v2 server (MLServer, Triton): an HTTP, a gRPC and a metrics port."""

    port_names = ("http", "grpc", "metrics")
    inference_port = "http"
    metrics_port_name = "metrics"

    @property
    def http_port(self) -> int:
        return self.ports.get("http", 0)

    @property
    def grpc_port(self) -> int:
        return self.ports.get("grpc", 0)

    @property
    def metrics_port(self) -> int:
        return self.ports.get("metrics", 0)
