"""MLServer started on this machine: from its own environment, every listener on
127.0.0.1, the bundled model (or a copy of a user's model folder) served from a model
repository in a temporary folder."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import to_native
from batchpilot.runtimes.mlserver.control import KNOBS, MODEL, MODEL_FILE, ModelRepository
from batchpilot.runtimes.mlserver.user import UserModel
from batchpilot.runtimes.process import V2Process
from batchpilot.runtimes.venvs import venv_executable

VENV = "mlserver-1.7.1"
# of the log, in the message of a start that failed
_LAUNCH_LOG_TAIL = 1500


class MLServerProcess(V2Process):
    """MLServer from its own environment on 127.0.0.1 (HTTP, gRPC and metrics each on a
    free port), serving the bundled model from a model repository in a temporary folder.
    Its own process group, so a stop leaves nothing behind."""

    what = "MLServer"

    def __init__(
        self,
        start: BatchingConfig,
        *,
        threads: int | None = None,
        ready_timeout_s: float = 90.0,
        stop_timeout_s: float = 10.0,
        user: UserModel | None = None,
    ) -> None:
        super().__init__(
            threads=threads, ready_timeout_s=ready_timeout_s, stop_timeout_s=stop_timeout_s
        )
        self.start_config = start
        self.user = user
        self.native_start = dict(user.baseline) if user is not None else to_native(KNOBS, start)
        self.model = user.name if user is not None else MODEL
        self._env: dict[str, str] = {}
        self.repository: ModelRepository | None = None

    async def _prepare(self) -> None:
        workdir = await self._new_root("batchpilot-mlserver-")
        code = workdir / "code"
        code.mkdir()
        if self.user is None:
            source = resources.files("batchpilot.runtimes").joinpath("models", MODEL_FILE)
            (code / MODEL_FILE).write_bytes(source.read_bytes())
        # a user's model is imported from its own folder (MLServer puts it on the path)
        models = workdir / "models"
        self.repository = ModelRepository(models, user=self.user)
        self.repository.write(self.native_start)
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
        self._env = env

    async def start(self) -> None:
        """Start MLServer and wait until the model is ready. A restart keeps the ports
        and the repository, at the start-up configuration again (a newer version)."""
        program = venv_executable(VENV, "mlserver", runtime="MLServer")
        await self._start_on_ports(lambda: self._start_once(program))

    async def _start_once(self, program: Path) -> None:
        if self.root is None or self.repository is None:
            await self._prepare()
        else:
            self.repository.write(self.native_start)
        assert self.root is not None
        assert self.repository is not None
        try:
            await self._spawn(
                [str(program), "start", str(self.repository.root)],
                env=self._env,
                cwd=self.root,  # MLServer keeps its metrics files under ./.metrics
            )
            await self._wait_ready(
                f"{self.url}/v2/models/{self.model}/ready", poll_s=0.1, tail=_LAUNCH_LOG_TAIL
            )
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop the process group and remove the temporary folder."""
        await super().stop()
        self.repository = None
