"""A local single-node Ray cluster with a Serve app (the bundled one, or a user's from a
folder of its own): `ray start --head --block` from Ray's own environment in a session of
its own, every address it advertises and every port it opens chosen on 127.0.0.1, its own
temporary folder (so its session, sockets and logs are its own), the app deployed through
the Serve REST API, ready when Serve reports it RUNNING and its HTTP proxy routes to it;
stopped by signalling every process of its session (Ray's workers put
themselves in process groups of their own, but stay in the session)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import aiohttp

from batchpilot.runtimes.base import LaunchError
from batchpilot.runtimes.process import RuntimeProcess, port_taken
from batchpilot.runtimes.procfs import live_session_pids, signal_all, wait_gone
from batchpilot.runtimes.rayserve.config import (
    BUNDLED_APP,
    RayServeError,
    ServeApp,
    deploy_config,
    deployment_state,
)
from batchpilot.runtimes.venvs import venv_dir, venv_executable

RAY_VERSION = "2.60"
VENV = f"ray-{RAY_VERSION}"
APP_FILE = "ray_batch_app.py"
HOST = "127.0.0.1"
_POLL_S = 0.25
_KILLED_GONE_S = 5.0
# The ports `ray start` takes besides the workers' (which it picks from its own range).
PORT_NAMES = (
    "gcs",
    "dashboard",
    "dashboard_agent_listen",
    "dashboard_agent_grpc",
    "metrics_export",
    "client_server",
    "node_manager",
    "object_manager",
    "runtime_env_agent",
    "http",
)


def start_again(message: str) -> bool:
    """Whether a first start that failed so is worth another, on fresh ports: a port was
    taken, or the node timed out during startup (its raylet did not come up, as when one
    of the ports Ray was given is taken, or the GCS had no CPU in time on a busy machine)."""
    return port_taken(message) or "timed out during startup" in message


class RayStartError(LaunchError):
    """Ray or the app did not become ready; the message carries the tail of Ray's log."""


def ray_environment(
    base: Mapping[str, str], *, app_dir: Path, threads: int | None
) -> dict[str, str]:
    """`base` for Ray's processes: the app importable (and nothing of BatchPilot's own
    path), Ray's environment first on PATH, no usage reporting, and Ray's single-machine
    mode, in which it advertises the loopback address instead of replacing 127.0.0.1 by
    the host's own address."""
    env = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    venv = venv_dir(VENV)
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *([env["PATH"]] if env.get("PATH") else [])])
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONPATH"] = str(app_dir)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if threads is not None:
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[name] = str(threads)
    return env


def start_args(ray: Path, ports: Mapping[str, int], temp_dir: Path, num_cpus: int) -> list[str]:
    return [
        str(ray),
        "start",
        "--head",
        "--block",
        f"--node-ip-address={HOST}",
        f"--port={ports['gcs']}",
        "--include-dashboard=true",
        f"--dashboard-host={HOST}",
        f"--dashboard-port={ports['dashboard']}",
        f"--dashboard-agent-listen-port={ports['dashboard_agent_listen']}",
        f"--dashboard-agent-grpc-port={ports['dashboard_agent_grpc']}",
        f"--metrics-export-port={ports['metrics_export']}",
        f"--ray-client-server-port={ports['client_server']}",
        f"--node-manager-port={ports['node_manager']}",
        f"--object-manager-port={ports['object_manager']}",
        f"--runtime-env-agent-port={ports['runtime_env_agent']}",
        f"--num-cpus={num_cpus}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]


class RayServeProcess(RuntimeProcess):
    """`async with RayServeProcess({"max_batch_size": 8, "batch_wait_timeout_s": 0.005})
    as ray: ... ray.url ...`; its `pid` is the `ray start` process, leader of the session
    every Ray process is in. `app` and `app_dir` (the folder its module is imported
    from) deploy a user's app instead of the bundled one."""

    what = "Ray"
    port_names = PORT_NAMES
    inference_port = "http"  # the Serve HTTP proxy: the app's base URL
    metrics_port_name = "metrics_export"

    def __init__(
        self,
        native: Mapping[str, float],
        *,
        threads: int | None = None,
        num_cpus: int = 2,
        ready_timeout_s: float = 180.0,
        stop_timeout_s: float = 15.0,
        app: ServeApp = BUNDLED_APP,
        app_dir: Path | None = None,
    ) -> None:
        super().__init__(
            threads=threads, ready_timeout_s=ready_timeout_s, stop_timeout_s=stop_timeout_s
        )
        if (app_dir is None) != (app == BUNDLED_APP):
            raise ValueError("a user's app comes with its folder, the bundled one without")
        self.native = dict(native)
        self.app = app
        self._app_dir = app_dir
        self._num_cpus = num_cpus

    @property
    def dashboard_url(self) -> str:
        return self.address("dashboard")

    async def start(self) -> None:
        """Start Ray, deploy the app and wait until it answers. A restart keeps the ports
        it had (clients hold its URL)."""
        ray = venv_executable(VENV, "ray", runtime="Ray")
        await self._start_on_ports(lambda: self._start_once(ray), retry_on=start_again)

    async def _start_once(self, ray: Path) -> None:
        # Ray's unix sockets live under the temporary folder: keep its path short.
        root = await self._new_root("bp-ray-", "/tmp")
        app_dir = self._app_dir
        if app_dir is None:
            app_dir = root / "app"
            app_dir.mkdir()
            source = resources.files("batchpilot.runtimes.models").joinpath(APP_FILE)
            (app_dir / APP_FILE).write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
        try:
            await self._spawn(
                start_args(ray, self.ports, root / "ray", self._num_cpus),
                env=ray_environment(os.environ, app_dir=app_dir, threads=self.threads),
                cwd=root,
            )
            await self._ready()
        except BaseException:
            await self.stop()
            raise

    async def _ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self._ready_timeout_s
        applications = f"{self.dashboard_url}/api/serve/applications/"
        await self._wait_ready(applications, poll_s=_POLL_S, error=RayStartError)
        document = deploy_config(self.native, http_port=self.ports["http"], app=self.app)
        timeout = aiohttp.ClientTimeout(total=30.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.put(applications, json=document) as response:
                if response.status != 200:
                    text = await response.text()
                    raise RayStartError(
                        f"Ray Serve refused the app (HTTP {response.status}): {text[:500]}"
                    )
            while True:
                if self._proc.returncode is not None:
                    raise RayStartError(
                        f"Ray exited with code {self._proc.returncode}; its log:\n"
                        f"{self.stderr_tail()}"
                    )
                # until the app is listed, the REST API names only the others
                with contextlib.suppress(
                    aiohttp.ClientError, TimeoutError, ValueError, RayServeError
                ):
                    if await self._serving(session, applications):
                        return
                if time.monotonic() >= deadline:
                    raise RayStartError(
                        f"the Serve app did not become ready within {self._ready_timeout_s:g} "
                        f"s; its logs are under {self.root}; Ray's log:\n{self.stderr_tail()}"
                    )
                await asyncio.sleep(_POLL_S)

    async def _serving(self, session: aiohttp.ClientSession, applications: str) -> bool:
        """Serve reports the app's deployment rolled out and the HTTP proxy routes the
        app's prefix (it answers 404 until its route table has it)."""
        async with session.get(applications) as response:
            if response.status != 200:
                return False
            details = await response.json()
        if not deployment_state(details, self.app.model).settled:
            return False
        async with session.get(f"{self.url}/-/routes") as response:
            if response.status != 200:
                return False
            routes = await response.json()
        return isinstance(routes, dict) and self.app.route_prefix in routes

    async def _terminate(self, proc: asyncio.subprocess.Process) -> None:
        """SIGTERM to every process of Ray's session, SIGKILL to those left after the
        grace."""
        await _end_session(proc.pid, self._stop_timeout_s)
        await proc.wait()


async def _end_session(sid: int, grace_s: float) -> None:
    """SIGTERM to every process of session `sid` but its leader, SIGKILL to whatever is
    left after `grace_s` (and to what started meanwhile), then SIGKILL to the leader:
    `ray start --block` only watches the others and does not end on SIGTERM."""
    others = functools.partial(live_session_pids, sid, but=sid)
    signal_all(others(), signal.SIGTERM)
    await wait_gone(others, grace_s, _POLL_S)
    signal_all(others(), signal.SIGKILL)
    signal_all([sid], signal.SIGKILL)
    # a killed process lingers until the kernel has torn it down
    await wait_gone(others, _KILLED_GONE_S, _POLL_S)
