"""The server's side of the model process: starts it, sends it batches and warm-ups one
at a time, and starts a new one if it dies.

Everything here runs on the event loop without blocking it: the socket is non-blocking
and driven by the loop's own socket calls. Nothing here imports PyTorch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence

from batchpilot.server.inputs import INPUT_RULES, InputRules, ModelInput
from batchpilot.server.model_process import HEADER, ModelInfo, Reply, Request, encode

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # importing PyTorch and building the model; CUDA start-up is slow
STOP_TIMEOUT_S = 5.0  # for a model process asked to stop to finish its batch and exit
DEATH_WAIT_S = 1.0  # for one whose socket failed to exit on its own, before it is killed


class ModelError(RuntimeError):
    """The model process failed a request, could not start, or died; the message is
    meant for the caller."""


def default_threads() -> int:
    """Every usable core but one, which is left to the server's event loop and the
    client; one on a 2-core machine."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def exit_description(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


class _Channel:
    """One model process and the socket to it.

    Requests go out whole and in order, and the model process answers them in order, so
    a second request can wait at the model process while the first computes. Each caller
    takes its own reply by ticket. Sends and reads run as tasks of their own: a caller
    that is cancelled cannot cut a message in half, and its reply, when it comes, is
    dropped."""

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.process = process
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.failure: ModelError | None = None
        self.ending = "was stopped"  # how the process ended, once it has
        self._sent = 1  # ticket 0 is the model process's hello, unasked
        self._received = 0
        self._replies: dict[int, Reply] = {}
        self._abandoned: set[int] = set()
        self._sending: asyncio.Task[None] | None = None
        self._reading: asyncio.Task[None] | None = None
        # told how the process ended when it dies under the server (not when stopped)
        self.on_death: Callable[[str], None] | None = None

    async def request(self, request: Request) -> Reply:
        ticket = self._sent
        self._sent += 1
        self._sending = self.loop.create_task(self._send(self._sending, encode(request)))
        return await self.reply(ticket)

    async def reply(self, ticket: int) -> Reply:
        try:
            while ticket not in self._replies:
                if self.failure is not None:
                    raise self.failure
                if self._reading is None or self._reading.done():
                    self._reading = self.loop.create_task(self._read_one())
                # wait(), not the task itself: a cancelled caller leaves the read running
                # (it must not stop halfway through a message), and a read cancelled by
                # close() wakes every caller to find the failure.
                await asyncio.wait({self._reading})
        except asyncio.CancelledError:
            if self._replies.pop(ticket, None) is None:
                self._abandoned.add(ticket)
            raise
        return self._replies.pop(ticket)

    @property
    def busy(self) -> bool:
        """Whether a read or send is under way (an event loop must not be left with one)."""
        return any(t is not None and not t.done() for t in (self._sending, self._reading))

    async def _send(self, previous: asyncio.Task[None] | None, frame: bytes) -> None:
        if previous is not None and not previous.done():
            await asyncio.wait({previous})  # frames must not interleave
        if self.failure is not None:
            return
        try:
            await self.loop.sock_sendall(self.sock, frame)
        except OSError as exc:
            self.fail(exc)

    async def _read_one(self) -> None:
        try:
            (length,) = HEADER.unpack(await self._read_exactly(HEADER.size))
            reply = pickle.loads(await self._read_exactly(length))
        except Exception as exc:  # closed, reset, or a message that makes no sense
            self.fail(exc)
            return
        if not isinstance(reply, Reply):
            self.fail(TypeError(f"the model process answered a {type(reply).__name__}"))
            return
        ticket = self._received
        self._received += 1
        if ticket in self._abandoned:
            self._abandoned.discard(ticket)
        else:
            self._replies[ticket] = reply

    async def _read_exactly(self, size: int) -> bytes:
        buffer = bytearray(size)
        view = memoryview(buffer)
        received = 0
        while received < size:
            count = await self.loop.sock_recv_into(self.sock, view[received:])
            if count == 0:
                raise EOFError("the model process closed its socket")
            received += count
        return bytes(buffer)

    def fail(self, cause: BaseException) -> None:
        """The model process is gone or unusable: reap it, and fail every waiting and
        later request with the reason."""
        if self.failure is not None:
            return
        self.ending = exit_description(self.close(wait_s=DEATH_WAIT_S))
        log.error(
            "model process %d %s (%s); a new one starts with the next request",
            self.process.pid,
            self.ending,
            cause,
        )
        self.failure = ModelError(
            f"the model process {self.ending}; a new one starts with the next batch"
        )
        if self.on_death is not None:
            self.on_death(self.ending)

    def close(self, wait_s: float) -> int:
        """Stop the pending send and read (their callers then find the failure), close
        the socket and reap the process, killing it after `wait_s`; its exit code."""
        if self.failure is None:
            self.failure = ModelError("the model process was stopped")
        current = asyncio.current_task() if self.loop.is_running() else None
        for task in (self._sending, self._reading):
            # A socket closed under a pending read never wakes it: cancel it first.
            if task is not None and task is not current and not self.loop.is_closed():
                task.cancel()
        self.sock.close()
        if self.process.returncode is not None:
            return self.process.returncode
        try:
            return self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


class InferenceEngine:
    """One workload on one device, in its own model process."""

    def __init__(self, model: str, device: str, threads: int) -> None:
        if model not in INPUT_RULES:
            raise ValueError(f"unknown model {model!r}: choose one of {', '.join(INPUT_RULES)}")
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.rules: type[InputRules] = INPUT_RULES[model]
        self.requested_device = device
        self.threads = threads
        self.info: ModelInfo | None = None
        self._channel: _Channel | None = None
        self._warmed = 0  # the largest batch size warmed up, kept across restarts
        # model processes that died under the server (killed, out of memory, crashed),
        # and how the last one ended: a tuner reads them to tell a crash from a slow
        # configuration, since the server answers 500 and starts a new one
        self.crashes = 0
        self.last_crash = ""
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    @property
    def model(self) -> str:
        return self.rules.name

    @property
    def device(self) -> str:
        """The device in use once started ("cpu", "cuda:0"), the one asked for before."""
        return self.requested_device if self.info is None else self.info.device

    @property
    def pid(self) -> int | None:
        """The model process's, while one runs."""
        channel = self._channel
        return None if channel is None or channel.failure else channel.process.pid

    async def start(self) -> ModelInfo:
        """Start the model process if it is not running; raises ModelError with the
        reason when it cannot start (no CUDA device, ...)."""
        await self._ready_channel()
        assert self.info is not None
        return self.info

    async def run_batch(self, inputs: Sequence[ModelInput]) -> list[list[int]]:
        """The classes for each input. Batches may be sent while an earlier one computes:
        the model process runs them in the order they were sent."""
        value = await self._call(Request("forward", inputs=tuple(inputs)))
        assert isinstance(value, list)
        return value

    async def warm_up(self, max_batch_size: int) -> None:
        """Run the batch sizes up to `max_batch_size` not warmed up yet, in turn with
        real batches."""
        if max_batch_size <= self._warmed:
            return
        seconds = await self._call(Request("warm_up", max_batch_size=max_batch_size))
        self._warmed = max(self._warmed, max_batch_size)
        log.info(
            "warmed up %s on %s at batch sizes up to %d in %.2f s",
            self.model,
            self.device,
            max_batch_size,
            seconds,
        )

    def close(self) -> None:
        """Close the socket (the model process exits when it sees that), and wait."""
        if self._channel is not None:
            self._channel.close(wait_s=STOP_TIMEOUT_S)
            self._channel = None

    async def _call(self, request: Request) -> object:
        channel = await self._ready_channel()
        reply = await channel.request(request)
        if reply.error is not None:
            raise ModelError(reply.error)
        return reply.value

    def _usable(self, channel: _Channel | None) -> bool:
        return (
            channel is not None
            and channel.failure is None
            # Tests run one engine across event loops; a channel's tasks live in one.
            and (channel.loop is asyncio.get_running_loop() or not channel.busy)
        )

    async def _ready_channel(self) -> _Channel:
        if self._usable(self._channel):
            assert self._channel is not None
            if self._channel.loop is not asyncio.get_running_loop():
                self._channel.loop = asyncio.get_running_loop()
            return self._channel
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        async with self._lock:  # one start at a time; the others wait for it
            if not self._usable(self._channel):
                self.close()
                self._channel = await self._start_channel()
        assert self._channel is not None
        return self._channel

    async def _start_channel(self) -> _Channel:
        ours, theirs = socket.socketpair()
        try:
            # Popen returns once the child is exec'ed (about a millisecond); the slow
            # part, loading the model, is awaited below. An asyncio subprocess would tie
            # the process to one event loop, and close() must work without one.
            process = subprocess.Popen(  # noqa: ASYNC220
                [
                    sys.executable,
                    "-m",
                    "batchpilot.server.model_process",
                    f"--fd={theirs.fileno()}",
                    f"--model={self.model}",
                    f"--device={self.requested_device}",
                    f"--threads={self.threads}",
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            ours.close()
            raise ModelError(f"cannot start the model process: {exc}") from None
        finally:
            theirs.close()
        ours.setblocking(False)
        channel = _Channel(process, ours)
        channel.on_death = self._crashed
        try:
            self.info = await self._hello(channel)
            log.info(
                "model process %d: %s on %s, %d torch thread(s)",
                process.pid,
                self.model,
                self.info.device,
                self.threads,
            )
            if self._warmed:
                # A replacement runs the shapes its predecessor had warmed up first.
                reply = await channel.request(Request("warm_up", max_batch_size=self._warmed))
                if reply.error is not None:
                    raise ModelError(f"warm-up failed: {reply.error}")
        except BaseException:
            # Half-started (failed, timed out or cancelled): it goes, and the next
            # request starts afresh.
            channel.close(wait_s=0)
            raise
        return channel

    def _crashed(self, ending: str) -> None:
        self.crashes += 1
        self.last_crash = ending

    async def _hello(self, channel: _Channel) -> ModelInfo:
        try:
            hello = await asyncio.wait_for(channel.reply(0), START_TIMEOUT_S)
        except TimeoutError:
            raise ModelError(
                f"the model process did not load {self.model} within {START_TIMEOUT_S:g} s"
            ) from None
        except ModelError:
            raise ModelError(
                f"the model process {channel.ending} before loading {self.model} (its log is above)"
            ) from None
        if hello.error is not None or not isinstance(hello.value, ModelInfo):
            raise ModelError(f"the model process could not load {self.model}: {hello.error}")
        return hello.value
