"""A local Triton with the bundled model (repository written at start) or a model
repository of the user's own, every listener on
127.0.0.1 and a free port, explicit model control (so batching can change live), ready
when Triton says the server and its models are, stopped as a whole process group (the
python backend's stub processes included)."""

from __future__ import annotations

import os
from pathlib import Path

from batchpilot.runtimes.base import LaunchError
from batchpilot.runtimes.process import V2Process
from batchpilot.runtimes.triton.install import TritonInstall, find_install
from batchpilot.runtimes.triton.repository import (
    MODEL_NAME,
    TritonBatching,
    write_backends,
    write_repository,
)

_POLL_S = 0.1
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
    models: Path | None = None,
) -> list[str]:
    """The `tritonserver` command line for the repository under `root` (written by
    `write_repository`), or for the model repository `models` with the backends under
    `root` (`write_backends`): explicit model control, so batching can change live, and
    every listener on `host`."""
    return [
        str(install.binary),
        f"--model-repository={models or root / 'models'}",
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


class TritonProcess(V2Process):
    """`async with TritonProcess(TritonBatching(8, 5000)) as triton: ... triton.url ...`

    With `models=DIR, model=NAME` it serves model NAME of the user's repository DIR as
    its config.pbtxt has it (`batching` None), from the python backend of the runtime's
    environment."""

    what = "Triton"

    def __init__(
        self,
        batching: TritonBatching | None = None,
        *,
        models: Path | None = None,
        model: str = MODEL_NAME,
        venv: Path | None = None,
        instances: int = 1,
        threads: int | None = None,
        ready_timeout_s: float = 60.0,
        stop_timeout_s: float = 15.0,
    ) -> None:
        super().__init__(
            threads=threads, ready_timeout_s=ready_timeout_s, stop_timeout_s=stop_timeout_s
        )
        if (batching is None) == (models is None):
            raise ValueError(
                "give the bundled model's batching or a model repository (models=), one of them"
            )
        self.batching = batching
        self.models = models
        self.model = model if models is not None else MODEL_NAME
        self._venv = venv
        self._instances = instances
        self.install: TritonInstall | None = None

    def args(self) -> list[str]:
        assert self.install is not None
        assert self.root is not None
        return server_args(
            self.install,
            self.root,
            host=self.host,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            model=self.model,
            models=self.models,
        )

    async def start(self) -> None:
        """Write the repository, start Triton and wait until it and the model are ready.
        A restart keeps the ports it had (clients hold its URL) and writes the repository
        again at the starting configuration."""
        self.install = await find_install(self._venv)
        root = await self._new_root("batchpilot-triton-")
        if self.batching is not None:
            write_repository(root, self.install, self.batching, instances=self._instances)
        else:
            write_backends(root, self.install)
        try:
            await self._start_on_ports(self._start_once)
        except BaseException:
            await self._remove_root()
            raise

    async def _start_once(self) -> None:
        assert self.root is not None
        try:
            # its own process group: a stop ends the python backend's stubs with it
            await self._spawn(self.args(), env=self._environment(), cwd=self.root)
            await self._wait_ready(
                f"{self.url}/v2/health/ready", poll_s=_POLL_S, error=TritonStartError
            )
            # Triton opens its metrics port after the HTTP one: the counters every change
            # is verified by must answer before the server counts as started
            await self._wait_ready(self.metrics_url, poll_s=_POLL_S, error=TritonStartError)
        except BaseException:
            await self._end_process()
            raise

    def _environment(self) -> dict[str, str]:
        assert self.install is not None
        env = self.install.environment(dict(os.environ))
        if self.threads is not None:
            # the bundled model's matrix product runs on numpy's BLAS threads
            for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
                env[name] = str(self.threads)
        return env
