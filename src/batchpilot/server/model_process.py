"""The model process: where the forward passes run, one batch at a time.

The server's HTTP process spawns it (`python -m batchpilot.server.model_process`) and
talks to it over a socket pair. It has its own interpreter lock: in one process the
forward pass and the HTTP event loop took turns with the lock, and since every PyTorch
call releases it and must win it back from a busy loop, the same forward pass ran
1.4-1.8x slower inside the server than alone.

Protocol: every message is an 8-byte big-endian length and a pickle. The server sends a
`Request`; the model process answers each with one `Reply`, in order. The first message
is the model process's own: a `Reply` whose value is `ModelInfo`, or the error that kept
it from starting. It exits when the socket closes, so it never outlives the server.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import pickle
import signal
import socket
import struct
import time
from typing import Literal, NamedTuple

from batchpilot.server.inputs import INPUT_RULES, ModelInput

log = logging.getLogger("batchpilot.server.model_process")

HEADER = struct.Struct("!Q")


# The messages are named tuples: one Request and one Reply cross per batch, and a
# dataclass pickles four times slower.


class ModelInfo(NamedTuple):
    model: str
    device: str  # as resolved: "cpu", "cuda:0"
    threads: int


class Request(NamedTuple):
    # forward: run `inputs` as one batch, answer [classes per input];
    # warm_up: run every batch shape up to `max_batch_size`, answer the seconds it took.
    kind: Literal["forward", "warm_up"]
    inputs: tuple[ModelInput, ...] = ()
    max_batch_size: int = 0


class Reply(NamedTuple):
    value: object = None
    error: str | None = None  # "ExceptionType: message" when the request failed


def encode(message: object) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def warm_up_batch_sizes(max_batch_size: int) -> list[int]:
    """Powers of two up to `max_batch_size`, and `max_batch_size` itself: the shapes the
    first real batches will have, so none pays for first-call allocation."""
    sizes = {max_batch_size}
    size = 1
    while size < max_batch_size:
        sizes.add(size)
        size *= 2
    return sorted(sizes)


def _receive(sock: socket.socket) -> object | None:
    """The next message, or None once the server has closed its end."""
    header = _read_exactly(sock, HEADER.size)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    payload = _read_exactly(sock, length)
    if payload is None:
        return None
    message: object = pickle.loads(payload)
    return message


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    buffer = bytearray(size)
    view = memoryview(buffer)
    received = 0
    while received < size:
        count = sock.recv_into(view[received:])
        if count == 0:
            return None
        received += count
    return bytes(buffer)


class _Model:
    """The loaded workload and what has been warmed up on it."""

    def __init__(self, model: str, device: str, threads: int) -> None:
        import torch

        from batchpilot.server.workloads import WORKLOADS, resolve_device

        torch.set_num_threads(threads)
        self._torch = torch
        self.workload = WORKLOADS[model](resolve_device(device))
        self.info = ModelInfo(model, str(self.workload.device), threads)
        self._warmed = 0

    def forward(self, inputs: tuple[ModelInput, ...]) -> list[list[int]]:
        with self._torch.inference_mode():
            outputs = self.workload.forward(inputs)
        if self.workload.device.type == "cuda":
            self._torch.cuda.synchronize(self.workload.device)
        return outputs

    def warm_up(self, max_batch_size: int) -> float:
        started = time.perf_counter()
        rules = self.workload.rules
        unit = rules.synthetic_input(1)
        longer = rules.synthetic_input(min(16, rules.max_size))
        for size in warm_up_batch_sizes(max_batch_size):
            if size <= self._warmed:
                continue
            for _ in range(2):
                self.forward((unit,) * size)
            self.forward((longer,) * size)
        self._warmed = max(self._warmed, max_batch_size)
        return time.perf_counter() - started

    def answer(self, request: Request) -> Reply:
        try:
            if request.kind == "forward":
                return Reply(self.forward(request.inputs))
            if request.kind == "warm_up":
                return Reply(self.warm_up(request.max_batch_size))
            raise ValueError(f"unknown request kind {request.kind!r}")
        except Exception as exc:  # a failing batch fails its own requests, not the process
            log.exception("%s request failed", request.kind)
            return Reply(error=describe(exc))


def serve_model(sock: socket.socket, model: str, device: str, threads: int) -> None:
    """Load the model, say so, then answer requests until the socket closes."""
    try:
        loaded = _Model(model, device, threads)
    except Exception as exc:
        sock.sendall(encode(Reply(error=describe(exc))))
        return
    sock.sendall(encode(Reply(loaded.info)))
    while (request := _receive(sock)) is not None:
        if not isinstance(request, Request):
            reply = Reply(error=f"expected a Request, got {type(request).__name__}")
        else:
            reply = loaded.answer(request)
        sock.sendall(encode(reply))


def main() -> None:
    parser = argparse.ArgumentParser(description="The reference server's model process.")
    parser.add_argument("--fd", type=int, required=True, help="the socket to the server")
    parser.add_argument("--model", choices=sorted(INPUT_RULES), required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--threads", type=int, required=True)
    args = parser.parse_args()
    # The server decides when to stop: a Ctrl-C or SIGTERM to the whole process group
    # must not kill the model under a draining server. It exits when the socket closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # ConnectionError: the server went away mid-message; nothing waits for an answer.
    with socket.socket(fileno=args.fd) as sock, contextlib.suppress(ConnectionError):
        sock.setblocking(True)
        serve_model(sock, args.model, args.device, args.threads)


if __name__ == "__main__":
    # Run as a script this file is `__main__`; the messages must pickle under their
    # importable names, so the importable copy of the module does the work.
    from batchpilot.server import model_process

    model_process.main()
