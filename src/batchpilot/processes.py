"""Child processes on loopback ports (the reference server, the stub, Prometheus): a free
port, waiting for readiness, a stop that always ends the process, the tail of its log."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Self

import aiohttp


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free on `host` now. Another process may still take it
    before the caller binds; callers on a shared machine should be ready to retry."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free on `host` now, ascending (see `free_port`)."""
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port(host))
    return sorted(ports)


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def exit_code_of(process: asyncio.subprocess.Process, grace_s: float) -> int | None:
    """The exit code once `process` has exited (waiting up to `grace_s` for the event
    loop to notice), None while it runs."""
    if process.returncode is None and grace_s > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), grace_s)
    return process.returncode


class ChildProcess(ABC):
    """`async with` a child process: start() on entry (which cleans up after itself if
    it fails), stop() on exit."""

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


class NotReady(Exception):
    """The process did not answer in time; `returncode` is set when it exited first."""

    def __init__(self, returncode: int | None) -> None:
        super().__init__(
            "exited before it was ready" if returncode is not None else "not ready in time"
        )
        self.returncode = returncode


async def wait_ready(
    process: asyncio.subprocess.Process,
    url: str,
    *,
    timeout_s: float,
    poll_s: float,
    probe_timeout_s: float = 2.0,
) -> None:
    """Return once GET `url` answers 200; raise NotReady if the process exits first or
    `timeout_s` passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    timeout = aiohttp.ClientTimeout(total=probe_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            if process.returncode is not None:
                raise NotReady(process.returncode)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            if loop.time() >= deadline:
                raise NotReady(None)
            # Waiting on the process rather than sleeping notices an early exit at once.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), poll_s)


async def stop_process(process: asyncio.subprocess.Process, grace_s: float) -> int:
    """SIGTERM (the child may drain), then SIGKILL if it has not gone after `grace_s`;
    its exit code. A process that already exited is left as it is."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    assert process.returncode is not None  # wait() has returned
    return process.returncode


def read_tail(file: IO[bytes], limit: int) -> str:
    """The last `limit` bytes of an open log file, decoded leniently (a cut may split a
    character)."""
    size = file.seek(0, os.SEEK_END)
    file.seek(max(0, size - limit))
    return file.read().decode("utf-8", errors="replace")


def run_in_foreground(command: Sequence[str], *, env: Mapping[str, str], cwd: Path) -> int:
    """Run `command` as a child in this process group (whoever stops the group stops its
    children too), pass SIGTERM and SIGINT on to it, and return its exit code once it has
    stopped: a container command that wraps a server."""
    process = subprocess.Popen(list(command), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL)

    def forward(signum: int, frame: FrameType | None) -> None:
        if process.poll() is None:
            process.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return process.wait()
