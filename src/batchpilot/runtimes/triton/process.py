"""A local Triton with the bundled model: repository written at start, every listener on
127.0.0.1 and a free port, explicit model control (so batching can change live), ready
when Triton says the server and its models are, stopped as a whole process group (the
python backend's stub processes included)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import IO

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
from batchpilot.runtimes.triton.install import TritonInstall, find_install
from batchpilot.runtimes.triton.repository import MODEL_NAME, TritonBatching, write_repository

LOG_TAIL_BYTES = 4000
_POLL_S = 0.1
_PORT_ATTEMPTS = 3
# Triton waits this long for in-flight requests on SIGTERM before it exits.
_EXIT_TIMEOUT_S = 5


class TritonStartError(LaunchError):
    """Triton did not become ready; the message carries the tail of its log."""


def server_args(
    install: TritonInstall,
    root: Path,
    *,
    host: str,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    model: str = MODEL_NAME,
) -> list[str]:
    """The `tritonserver` command line for the repository under `root` (written by
    `write_repository`): explicit model control, so batching can change live, and every
    listener on `host`."""
    return [
        str(install.binary),
        f"--model-repository={root / 'models'}",
        f"--backend-directory={root / 'backends'}",
        "--model-control-mode=explicit",
        f"--load-model={model}",
        f"--http-address={host}",
        f"--http-port={http_port}",
        f"--grpc-address={host}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={host}",
        f"--metrics-port={metrics_port}",
        "--allow-gpu-metrics=false",
        "--metrics-config=summary_latencies=true",
        f"--exit-timeout-secs={_EXIT_TIMEOUT_S}",
    ]


class TritonProcess(ChildProcess):
    """`async with TritonProcess(TritonBatching(8, 5000)) as triton: ... triton.url ...`"""

    def __init__(
        self,
        batching: TritonBatching,
        *,
        venv: Path | None = None,
        instances: int = 1,
        threads: int | None = None,
        ready_timeout_s: float = 60.0,
        stop_timeout_s: float = 15.0,
    ) -> None:
        self.batching = batching
        self.model = MODEL_NAME
        self.host = "127.0.0.1"
        self.http_port = self.grpc_port = self.metrics_port = 0
        self._venv = venv
        self._instances = instances
        self._threads = threads
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None
        self._final_log = ""
        self._root: Path | None = None
        self.install: TritonInstall | None = None
        self.returncode: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("Triton has not been started")
        return self._proc.pid

    def args(self) -> list[str]:
        assert self.install is not None
        assert self._root is not None
        return server_args(
            self.install,
            self._root,
            host=self.host,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
        )

    async def start(self) -> None:
        """Write the repository, start Triton and wait until it and the model are ready.
        A port taken by someone else between choosing and binding it is retried on fresh
        ports; a restart keeps the ports it had (clients hold its URL)."""
        self.install = await find_install(self._venv)
        self._root = Path(tempfile.mkdtemp(prefix="batchpilot-triton-"))
        write_repository(self._root, self.install, self.batching, instances=self._instances)
        keep = self.http_port != 0
        for attempt in range(_PORT_ATTEMPTS):
            if not keep or attempt > 0:
                self.http_port, self.grpc_port, self.metrics_port = free_ports(3, self.host)
            try:
                await self._start_once()
                return
            except TritonStartError as exc:
                if "already in use" not in str(exc) or attempt == _PORT_ATTEMPTS - 1:
                    await self._cleanup()
                    raise

    async def restart(self) -> None:
        """Stop Triton (if it still runs) and start it again on the same ports with the
        starting configuration (a live change does not survive a restart)."""
        await self.stop()
        await self.start()

    async def _start_once(self) -> None:
        assert self.install is not None
        assert self._root is not None
        self.returncode = None
        # A file rather than a pipe: nobody reads the log while Triton runs.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        self._proc = await asyncio.create_subprocess_exec(
            *self.args(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._log,
            stderr=asyncio.subprocess.STDOUT,
            env=self._environment(),
            cwd=self._root,
            # its own process group: stop() ends the stub processes with it
            start_new_session=True,
        )
        try:
            await wait_ready(
                self._proc,
                f"{self.url}/v2/health/ready",
                timeout_s=self._ready_timeout_s,
                poll_s=_POLL_S,
            )
        except NotReady as exc:
            await self._stop_process()
            what = (
                f"exited with code {exc.returncode}"
                if exc.returncode is not None
                else f"was not ready within {self._ready_timeout_s:g} s"
            )
            raise TritonStartError(f"Triton {what}; its log:\n{self.stderr_tail()}") from None
        except BaseException:
            await self._stop_process()
            raise

    def _environment(self) -> dict[str, str]:
        assert self.install is not None
        env = self.install.environment(dict(os.environ))
        if self._threads is not None:
            # the bundled model's matrix product runs on numpy's BLAS threads
            for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
                env[name] = str(self._threads)
        return env

    async def stop(self) -> None:
        """SIGTERM to the process group (Triton unloads its models and exits), SIGKILL to
        the group after the grace; the repository is removed."""
        await self._stop_process()
        await self._cleanup()

    async def _stop_process(self) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.returncode is None:
                signal_group(proc.pid, signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), self._stop_timeout_s)
                except TimeoutError:
                    signal_group(proc.pid, signal.SIGKILL)
                    await proc.wait()
            # stubs that outlived their server (it was killed) go too
            signal_group(proc.pid, signal.SIGKILL)
            self.returncode = proc.returncode
        finally:
            self._proc = None
            if self._log is not None:
                self._final_log = read_tail(self._log, LOG_TAIL_BYTES)
                self._log.close()
                self._log = None

    async def _cleanup(self) -> None:
        if self._root is not None:
            await asyncio.to_thread(shutil.rmtree, self._root, True)
            self._root = None

    async def exit_code(self, grace_s: float = 0.0) -> int | None:
        """The exit code once Triton has exited (waiting up to `grace_s`), None while it
        runs."""
        proc = self._proc
        if proc is None:
            return self.returncode
        return await exit_code_of(proc, grace_s)

    def stderr_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        """The end of Triton's log (stdout and stderr), also after it exited."""
        if self._log is None:
            return self._final_log[-limit:]
        return read_tail(self._log, limit)
