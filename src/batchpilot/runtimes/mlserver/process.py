"""MLServer started on this machine: from its own environment, every listener on
127.0.0.1, the bundled model served from a model repository in a temporary folder."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
from importlib import resources
from pathlib import Path
from typing import IO

from batchpilot.models import BatchingConfig
from batchpilot.processes import (
    ChildProcess,
    NotReady,
    exit_code_of,
    free_ports,
    read_tail,
    signal_group,
    wait_ready,
)
from batchpilot.runtimes.base import LaunchError, to_native
from batchpilot.runtimes.mlserver.control import KNOBS, MODEL, MODEL_FILE, ModelRepository
from batchpilot.runtimes.venvs import venv_executable

VENV = "mlserver-1.7.1"
_STDERR_TAIL = 4000


class MLServerProcess(ChildProcess):
    """MLServer from its own environment on 127.0.0.1 (HTTP, gRPC and metrics each on a
    free port), serving the bundled model from a model repository in a temporary folder.
    Its own process group, so a stop leaves nothing behind."""

    def __init__(
        self,
        start: BatchingConfig,
        *,
        threads: int | None = None,
        ready_timeout_s: float = 90.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.start_config = start
        self.native_start = to_native(KNOBS, start)
        self.host = "127.0.0.1"
        self.threads = threads
        self.http_port = self.grpc_port = self.metrics_port = 0
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr: IO[bytes] | None = None
        self._final_stderr = ""
        self._workdir: Path | None = None
        self._env: dict[str, str] = {}
        self.repository: ModelRepository | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("MLServer has not been started")
        return self._proc.pid

    def _prepare(self) -> dict[str, str]:
        workdir = Path(tempfile.mkdtemp(prefix="batchpilot-mlserver-"))
        self._workdir = workdir
        code = workdir / "code"
        code.mkdir()
        source = resources.files("batchpilot.runtimes").joinpath("models", MODEL_FILE)
        (code / MODEL_FILE).write_bytes(source.read_bytes())
        models = workdir / "models"
        self.repository = ModelRepository(models)
        self.repository.write(self.native_start)
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3, self.host)
        settings = {
            "host": self.host,
            "http_port": self.http_port,
            "grpc_port": self.grpc_port,
            "metrics_port": self.metrics_port,
            # no worker pool: one process, the model in the server's event loop
            "parallel_workers": 0,
            "debug": False,
        }
        (models / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")
        threads = str(self.threads or 1)
        env = {
            **os.environ,
            "PYTHONPATH": str(code),
            # numpy's BLAS pool: one thread unless told, as the model competes with the
            # server's own loop for the same cores
            "OMP_NUM_THREADS": threads,
            "OPENBLAS_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
        }
        # MLServer also reads MLSERVER_* variables; ours must not leak settings in
        for name in [k for k in env if k.startswith("MLSERVER_")]:
            del env[name]
        return env

    async def start(self) -> None:
        """Start MLServer and wait until the model is ready. A restart keeps the ports
        and the repository, at the start-up configuration again (a newer version)."""
        program = venv_executable(VENV, "mlserver", runtime="MLServer")
        if self._workdir is None or self.repository is None:
            self._env = self._prepare()
        else:
            self.repository.write(self.native_start)
        assert self._workdir is not None
        assert self.repository is not None
        models, env = self.repository.root, self._env
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        self._proc = await asyncio.create_subprocess_exec(
            str(program),
            "start",
            str(models),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._stderr,
            stderr=self._stderr,
            env=env,
            cwd=self._workdir,  # MLServer keeps its metrics files under ./.metrics
            start_new_session=True,
        )
        try:
            await wait_ready(
                self._proc,
                f"{self.url}/v2/models/{MODEL}/ready",
                timeout_s=self._ready_timeout_s,
                poll_s=0.1,
            )
        except NotReady as exc:
            tail = self.stderr_tail(1500)
            await self.stop()
            raise LaunchError(f"MLServer {exc} (on {self.url}); its log:\n{tail}") from None
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop the process group and remove the temporary folder."""
        await self._terminate()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
            self.repository = None

    async def _terminate(self) -> None:
        proc = self._proc
        if proc is not None:
            if proc.returncode is None:
                signal_group(proc.pid, signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), self._stop_timeout_s)
                except TimeoutError:
                    signal_group(proc.pid, signal.SIGKILL)
                    await proc.wait()
            else:
                # the leader is gone; anything it left in its group goes too
                signal_group(proc.pid, signal.SIGKILL)
        if self._stderr is not None:
            self._final_stderr = read_tail(self._stderr, _STDERR_TAIL)
            self._stderr.close()
            self._stderr = None

    async def restart(self) -> None:
        await self._terminate()
        await self.start()

    async def exit_code(self, grace_s: float = 0.0) -> int | None:
        if self._proc is None:
            return None
        return await exit_code_of(self._proc, grace_s)

    def stderr_tail(self, limit: int = _STDERR_TAIL) -> str:
        if self._stderr is None:
            return self._final_stderr[-limit:]
        return read_tail(self._stderr, limit)
