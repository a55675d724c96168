"""TorchServe started on this machine: the `torchserve` launcher of its own environment
in the foreground (it runs the Java front end, which starts one Python worker per model
version), every listener on 127.0.0.1, a model store and logs in a temporary folder."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import IO

import aiohttp

from batchpilot.models import BatchingConfig
from batchpilot.processes import (
    ChildProcess,
    exit_code_of,
    free_ports,
    read_tail,
    signal_group,
)
from batchpilot.runtimes.base import LaunchError, to_native
from batchpilot.runtimes.torchserve.archive import config_properties, models_entry
from batchpilot.runtimes.torchserve.control import (
    KNOBS,
    MODEL,
    ModelStore,
    default_version,
    ready_workers,
)
from batchpilot.runtimes.venvs import venv_executable

VENV = "torchserve-0.12.0"
PORT_NAMES = ("inference", "management", "metrics", "grpc_inference", "grpc_management")
_STDERR_TAIL = 4000
_LAUNCH_LOG_TAIL = 1500
# what the Java front end writes for each request it answers: during a start, only our own
# readiness polling, which would push anything useful out of a log's tail
_ACCESS_LOG = "ACCESS_LOG - "
# each line a model's Python worker writes to stderr (a failed import, a handler's
# traceback), as the front end copies it into logs/model_log.log
_WORKER_STDERR = "-stderr MODEL_LOG - "


def launch_log(launcher_output: str, model_log: str, limit: int = _LAUNCH_LOG_TAIL) -> str:
    """What explains a start that failed: the tail of the model worker's stderr (where a
    broken environment or handler says why) when it wrote any, and the tail of the
    launcher's output, both without the access-log lines of our readiness polling."""
    worker = [
        line.split(_WORKER_STDERR, 1)[1]
        for line in model_log.splitlines()
        if _WORKER_STDERR in line
    ]
    output = [line for line in launcher_output.splitlines() if _ACCESS_LOG not in line]
    parts = []
    if worker:
        parts.append("the model worker's stderr:\n" + "\n".join(worker)[-limit:])
    parts.append("the launcher's output:\n" + ("\n".join(output)[-limit:] or "(nothing)"))
    return "\n".join(parts)


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the fields after the command name (which may hold spaces) in parentheses
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


async def wait_group_gone(pgid: int, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Whether every process of group `pgid` has gone within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not group_members(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll_s)


class TorchServeProcess(ChildProcess):
    """TorchServe 0.12 from its own environment serving the bundled handler, started at
    `start`. Its own process group: a stop waits until the launcher, the Java front end
    and every worker have gone."""

    def __init__(
        self,
        start: BatchingConfig,
        *,
        threads: int | None = None,
        ready_timeout_s: float = 120.0,
        stop_timeout_s: float = 15.0,
    ) -> None:
        self.start_config = start
        self.native_start = to_native(KNOBS, start)
        self.host = "127.0.0.1"
        self.threads = threads
        self.ports: dict[str, int] = {}
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr: IO[bytes] | None = None
        self._final_stderr = ""
        self._workdir: Path | None = None
        self.store: ModelStore | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.ports.get('inference', 0)}"

    @property
    def management_url(self) -> str:
        return f"http://{self.host}:{self.ports.get('management', 0)}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports.get('metrics', 0)}/metrics"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("TorchServe has not been started")
        return self._proc.pid

    def _prepare(self) -> tuple[Path, dict[str, str]]:
        """The config.properties for a (re)start: ports chosen once, the start values
        registered from a new archive version in the store."""
        if self._workdir is None or self.store is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="batchpilot-torchserve-"))
            (self._workdir / "store").mkdir()
            self.store = ModelStore(self._workdir / "store")
            self.ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES), self.host), strict=True))
        stale = self.store.versions()
        version, archive = self.store.add()
        for old in stale:
            self.store.remove(old)
        models = models_entry(MODEL, str(version), archive, self.native_start)
        config = self._workdir / "config.properties"
        config.write_text(
            config_properties(
                host=self.host,
                ports=self.ports,
                model_store=str(self.store.root),
                load_models=archive,
                models=models,
            )
        )
        threads = str(self.threads or 1)
        env = {
            **os.environ,
            # TorchServe's launcher keeps a pid file in the temp folder and refuses to start
            # while another TorchServe's is there: each instance gets its own
            "TMPDIR": str(self._workdir),
            "TEMP": str(self._workdir),
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
        }
        for name in [k for k in env if k.startswith("TS_")]:
            del env[name]  # TorchServe reads TS_* variables as configuration
        return config, env

    async def start(self) -> None:
        """Start TorchServe and wait until the model has a ready worker. A restart keeps
        the ports and the store, at the start-up configuration again (a newer version)."""
        program = venv_executable(VENV, "torchserve", runtime="TorchServe")
        if shutil.which("java") is None:
            raise LaunchError(
                "TorchServe needs Java 11 or later and no `java` is on PATH: run "
                "scripts/system-deps (it installs Debian's openjdk-17-jre-headless)"
            )
        config, env = self._prepare()
        assert self._workdir is not None
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        self._proc = await asyncio.create_subprocess_exec(
            str(program),
            "--start",
            "--foreground",
            "--ncs",
            "--ts-config",
            str(config),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._stderr,
            stderr=self._stderr,
            env=env,
            cwd=self._workdir,  # its logs go to ./logs
            start_new_session=True,
        )
        try:
            await self._wait_ready()
        except LaunchError as exc:
            # read before stop() removes the folder the logs are in
            log = launch_log(self.stderr_tail(), self._model_log())
            await self.stop()
            raise LaunchError(f"TorchServe {exc} (on {self.url}); {log}") from None
        except BaseException:
            await self.stop()
            raise

    def _model_log(self) -> str:
        """logs/model_log.log of this instance ("" when it has none yet)."""
        if self._workdir is None:
            return ""
        path = self._workdir / "logs" / "model_log.log"
        try:
            with path.open("rb") as file:
                return read_tail(file, _STDERR_TAIL * 4)
        except OSError:
            return ""

    async def _wait_ready(self) -> None:
        """Until the model's default version has a ready worker: TorchServe answers
        /ping "Healthy" before its worker has imported torch."""
        assert self._proc is not None
        deadline = time.monotonic() + self._ready_timeout_s
        url = f"{self.management_url}/models/{MODEL}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
            while True:
                if self._proc.returncode is not None:
                    raise LaunchError(f"exited with {self._proc.returncode} before it was ready")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with session.get(url) as response:
                        if response.status == 200 and ready_workers(
                            default_version(await response.json())
                        ):
                            return
                if time.monotonic() >= deadline:
                    raise LaunchError(f"had no ready worker within {self._ready_timeout_s:g} s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._proc.wait(), 0.25)

    async def stop(self) -> None:
        """Stop the whole process group and remove the temporary folder."""
        await self._terminate()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
            self.store = None

    async def _terminate(self) -> None:
        proc = self._proc
        if proc is not None:
            # Java and its workers first: the launcher waits for Java and reaps it, then
            # exits by itself (signalled first, it would leave Java an unreaped orphan)
            for pid in group_members(proc.pid):
                if pid != proc.pid:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGTERM)
            if not await wait_group_gone(proc.pid, self._stop_timeout_s):
                signal_group(proc.pid, signal.SIGKILL)
                await wait_group_gone(proc.pid, self._stop_timeout_s)
            if proc.returncode is None:
                await proc.wait()
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
