"""A runtime's first start moves to fresh ports when another process took one between
choosing and binding it (the shared CI machine does this); a restart never moves, and a
start that failed for another reason is not retried. The server is a real process
(`python -m http.server`), the taken port a real listening socket."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator

import aiohttp
import pytest

from batchpilot.processes import free_ports
from batchpilot.runtimes import process as runtime_process
from batchpilot.runtimes.base import LaunchError
from batchpilot.runtimes.process import PORT_ATTEMPTS, RuntimeProcess, port_taken

pytestmark = pytest.mark.component


class StaticServer(RuntimeProcess):
    """Python's own HTTP server as a runtime: one port, ready when it answers."""

    what = "http.server"
    port_names = ("http",)
    inference_port = "http"
    metrics_port_name = "http"

    def __init__(self, *extra_args: str) -> None:
        super().__init__(threads=None, ready_timeout_s=30.0, stop_timeout_s=5.0)
        self.extra_args = extra_args
        self.starts = 0

    async def start(self) -> None:
        await self._start_on_ports(self._start_once)

    async def _start_once(self) -> None:
        self.starts += 1
        root = await self._new_root("bp-ports-")
        argv = [sys.executable, "-m", "http.server", "--bind", self.host, *self.extra_args]
        try:
            await self._spawn([*argv, str(self.ports["http"])], env=os.environ, cwd=root)
            await self._wait_ready(f"{self.url}/", poll_s=0.05)
        except BaseException:
            await self.stop()
            raise


@pytest.fixture
def taken() -> Iterator[socket.socket]:
    """A port some other process listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


def port_of(sock: socket.socket) -> int:
    port: int = sock.getsockname()[1]
    return port


async def answers(url: str) -> bool:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(f"{url}/") as got:
        return got.status == 200


async def test_a_first_start_on_a_taken_port_moves_to_a_free_one(
    taken: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = [[port_of(taken)]]

    def taken_first(count: int, host: str = "127.0.0.1") -> list[int]:
        return chosen.pop() if chosen else free_ports(count, host)

    monkeypatch.setattr(runtime_process, "free_ports", taken_first)
    server = StaticServer()
    async with server:
        assert server.starts == 2
        assert server.ports["http"] != port_of(taken)
        assert await answers(server.url)


async def test_a_restart_keeps_its_port_and_fails_when_it_was_taken() -> None:
    server = StaticServer()
    async with server:
        port = server.ports["http"]
        await server._end_process()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen()
            with pytest.raises(LaunchError, match="already in use"):
                await server.restart()
        assert server.starts == 2
        assert server.ports["http"] == port


async def test_a_start_that_fails_for_another_reason_is_not_retried() -> None:
    server = StaticServer("--no-such-flag")  # http.server exits at once, code 2
    with pytest.raises(LaunchError, match="exited with code"):
        await server.start()
    assert server.starts == 1
    assert server.ports == {}  # a next start chooses again


async def test_a_port_taken_every_time_gives_up_after_the_attempts(
    taken: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime_process, "free_ports", lambda count, host: [port_of(taken)])
    server = StaticServer()
    with pytest.raises(LaunchError, match="already in use"):
        await server.start()
    assert server.starts == PORT_ATTEMPTS


@pytest.mark.parametrize(
    "log",
    [
        "RuntimeError: Failed to bind to address 127.0.0.1:47769",  # MLServer's gRPC
        "OSError: [Errno 98] error while attempting to bind on address "
        "('127.0.0.1', 8000): address already in use",  # uvicorn (vLLM, Ray's proxy)
        "java.net.BindException: Address already in use",  # TorchServe
        "E1207 Couldn't start HTTP server: Address in use",
    ],
)
def test_runtimes_messages_about_a_taken_port_are_recognised(log: str) -> None:
    assert port_taken(log)


def test_other_failures_are_not_taken_for_a_taken_port() -> None:
    assert not port_taken("ModuleNotFoundError: No module named 'mlserver_sklearn'")
    assert not port_taken("the Serve app did not become ready within 60 s")


def test_ray_starts_again_when_its_node_timed_out_during_startup() -> None:
    from batchpilot.runtimes.rayserve.process import start_again

    assert start_again(
        "Exception: The current node timed out during startup. This could happen because "
        "some of the raylet failed to startup or the GCS has become overloaded."
    )
    assert start_again("OSError: [Errno 98] address already in use")
    assert not start_again("Ray Serve refused the app (HTTP 400): bad config")
