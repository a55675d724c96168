"""A local single-node Ray cluster with the bundled Serve app: `ray start --head --block`
from Ray's own environment in a session of its own, every address it advertises and every
port it opens chosen on 127.0.0.1, its own temporary folder (so its session, sockets and
logs are its own), the app deployed through the Serve REST API, ready when the app
answers; stopped by signalling every process of its session (Ray's workers put
themselves in process groups of their own, but stay in the session)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import IO

import aiohttp

from batchpilot.processes import (
    ChildProcess,
    NotReady,
    exit_code_of,
    free_ports,
    read_tail,
    wait_ready,
)
from batchpilot.runtimes.base import LaunchError
from batchpilot.runtimes.rayserve.config import deploy_config
from batchpilot.runtimes.venvs import venv_dir, venv_executable

RAY_VERSION = "2.60"
VENV = f"ray-{RAY_VERSION}"
APP_FILE = "ray_batch_app.py"
HOST = "127.0.0.1"
LOG_TAIL_BYTES = 4000
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


def session_pids(sid: int) -> list[int]:
    """The processes of session `sid` (from /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the fields after the command (which may hold spaces) in parentheses
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid:
            pids.append(int(entry.name))
    return pids


class RayServeProcess(ChildProcess):
    """`async with RayServeProcess({"max_batch_size": 8, "batch_wait_timeout_s": 0.005})
    as ray: ... ray.url ...`"""

    def __init__(
        self,
        native: Mapping[str, float],
        *,
        threads: int | None = None,
        num_cpus: int = 2,
        ready_timeout_s: float = 180.0,
        stop_timeout_s: float = 15.0,
    ) -> None:
        self.native = dict(native)
        self.ports: dict[str, int] = {}
        self._threads = threads
        self._num_cpus = num_cpus
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None
        self._final_log = ""
        self.root: Path | None = None
        self.returncode: int | None = None

    def _url(self, port: str) -> str:
        if not self.ports:
            raise RuntimeError("Ray has not been started")
        return f"http://{HOST}:{self.ports[port]}"

    @property
    def url(self) -> str:
        """The Serve HTTP proxy: the app's base URL."""
        return self._url("http")

    @property
    def dashboard_url(self) -> str:
        return self._url("dashboard")

    @property
    def metrics_url(self) -> str:
        return self._url("metrics_export") + "/metrics"

    @property
    def pid(self) -> int:
        """The `ray start` process: leader of the session every Ray process is in."""
        if self._proc is None:
            raise RuntimeError("Ray has not been started")
        return self._proc.pid

    async def start(self) -> None:
        """Start Ray, deploy the app and wait until it answers. A restart keeps the ports
        it had (clients hold its URL)."""
        ray = venv_executable(VENV, "ray", runtime="Ray")
        # Ray's unix sockets live under the temporary folder: keep its path short.
        self.root = Path(tempfile.mkdtemp(prefix="bp-ray-", dir="/tmp"))
        app_dir = self.root / "app"
        app_dir.mkdir()
        source = resources.files("batchpilot.runtimes.models").joinpath(APP_FILE)
        (app_dir / APP_FILE).write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
        if not self.ports:
            self.ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES), HOST), strict=True))
        self.returncode = None
        # A file rather than a pipe: nobody reads the log while Ray runs.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as Ray
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *start_args(ray, self.ports, self.root / "ray", self._num_cpus),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=self._log,
                stderr=asyncio.subprocess.STDOUT,
                env=ray_environment(os.environ, app_dir=app_dir, threads=self._threads),
                cwd=self.root,
                start_new_session=True,
            )
            await self._ready()
        except BaseException:
            await self.stop()
            raise

    async def _ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self._ready_timeout_s
        try:
            await wait_ready(
                self._proc,
                f"{self.dashboard_url}/api/serve/applications/",
                timeout_s=self._ready_timeout_s,
                poll_s=_POLL_S,
            )
        except NotReady as exc:
            what = (
                f"exited with code {exc.returncode}"
                if exc.returncode is not None
                else f"was not ready within {self._ready_timeout_s:g} s"
            )
            raise RayStartError(f"Ray {what}; its log:\n{self.stderr_tail()}") from None
        document = deploy_config(self.native, http_port=self.ports["http"])
        timeout = aiohttp.ClientTimeout(total=30.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.put(
                f"{self.dashboard_url}/api/serve/applications/", json=document
            ) as response:
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
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.post(self.url + "/", json={"size": 1}) as response:
                        if response.status == 200:
                            return
                if time.monotonic() >= deadline:
                    raise RayStartError(
                        f"the Serve app did not answer within {self._ready_timeout_s:g} s; "
                        f"its logs are under {self.root}; Ray's log:\n{self.stderr_tail()}"
                    )
                await asyncio.sleep(_POLL_S)

    async def stop(self) -> None:
        """SIGTERM to every process of Ray's session, SIGKILL to those left after the
        grace; the temporary folder is removed."""
        proc = self._proc
        if proc is not None:
            try:
                await _end_session(proc.pid, self._stop_timeout_s)
                await proc.wait()
                self.returncode = proc.returncode
            finally:
                self._proc = None
                if self._log is not None:
                    self._final_log = read_tail(self._log, LOG_TAIL_BYTES)
                    self._log.close()
                    self._log = None
        if self.root is not None:
            await asyncio.to_thread(shutil.rmtree, self.root, True)
            self.root = None

    async def restart(self) -> None:
        """Stop Ray and start it again on the same ports with the starting configuration
        (a live change does not survive a restart)."""
        await self.stop()
        await self.start()

    async def exit_code(self, grace_s: float = 0.0) -> int | None:
        proc = self._proc
        if proc is None:
            return self.returncode
        return await exit_code_of(proc, grace_s)

    def stderr_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        """The end of `ray start`'s output, also after it exited."""
        if self._log is None:
            return self._final_log[-limit:]
        return read_tail(self._log, limit)


async def _end_session(sid: int, grace_s: float) -> None:
    """SIGTERM to every process of session `sid` but its leader, SIGKILL to whatever is
    left after `grace_s` (and to what started meanwhile), then SIGKILL to the leader:
    `ray start --block` only watches the others and does not end on SIGTERM."""
    _signal_all([pid for pid in session_pids(sid) if pid != sid], signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not live_session_pids(sid, but=sid):
            break
        await asyncio.sleep(_POLL_S)
    _signal_all([pid for pid in session_pids(sid) if pid != sid], signal.SIGKILL)
    _signal_all([sid], signal.SIGKILL)
    # a killed process lingers until the kernel has torn it down
    deadline = time.monotonic() + _KILLED_GONE_S
    while live_session_pids(sid, but=sid):
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(_POLL_S)


def live_session_pids(sid: int, *, but: int | None = None) -> list[int]:
    """The processes of session `sid` that have not exited (zombies left out)."""
    return [pid for pid in session_pids(sid) if pid != but and not _zombie(pid)]


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
