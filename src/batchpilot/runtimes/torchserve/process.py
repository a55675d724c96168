"""TorchServe started on this machine: the `torchserve` launcher of its own environment
in the foreground (it runs the Java front end, which starts one Python worker per model
version), every listener on 127.0.0.1, a model store and logs in a temporary folder."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import shutil
import signal
import time
from pathlib import Path

import aiohttp

from batchpilot.models import BatchingConfig
from batchpilot.processes import read_tail, signal_group
from batchpilot.runtimes.base import LaunchError, to_native
from batchpilot.runtimes.process import LOG_TAIL_BYTES, RuntimeProcess
from batchpilot.runtimes.procfs import group_members, signal_all, wait_gone
from batchpilot.runtimes.torchserve.archive import config_properties, models_entry
from batchpilot.runtimes.torchserve.control import (
    KNOBS,
    MODEL,
    ArchiveStore,
    ModelStore,
    default_version,
    ready_workers,
)
from batchpilot.runtimes.torchserve.user import UserArchive, extract_archive
from batchpilot.runtimes.venvs import venv_executable

VENV = "torchserve-0.12.0"
_STOP_POLL_S = 0.05
_LAUNCH_LOG_TAIL = 1500
# what the Java front end writes for each request it answers: during a start, only our own
# readiness polling, which would push anything useful out of a log's tail
_ACCESS_LOG = "ACCESS_LOG - "
# each line a model's Python worker writes to stderr (a failed import, a handler's
# traceback), as the front end copies it into logs/model_log.log
_WORKER_STDERR = "-stderr MODEL_LOG - "
# any line a model's Python worker wrote, stdout (its logging) or stderr
_WORKER_LOG = re.compile(r"-std(out|err) MODEL_LOG - ")
_TRACEBACK = "Traceback (most recent call last):"


def worker_stderr(model_log: str) -> list[str]:
    """The lines a model's Python worker wrote to stderr, from logs/model_log.log."""
    return [
        line.split(_WORKER_STDERR, 1)[1]
        for line in model_log.splitlines()
        if _WORKER_STDERR in line
    ]


def handler_exception(model_log: str) -> str:
    """The exception line that ends the last traceback a model's worker logged ("" when
    none): TorchServe answers a handler's exception with 503 "Prediction failed" and
    logs the traceback (through the worker's stdout) into logs/model_log.log."""
    lines = [
        line.split(" MODEL_LOG - ", 1)[1]
        for line in model_log.splitlines()
        if _WORKER_LOG.search(line)
    ]
    starts = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)]
    if not starts:
        return ""
    return next((line.strip() for line in lines[starts[-1] + 1 :] if line[:1].strip()), "")


def launch_log(launcher_output: str, model_log: str, limit: int = _LAUNCH_LOG_TAIL) -> str:
    """What explains a start that failed: the tail of the model worker's stderr (where a
    broken environment or handler says why) when it wrote any, and the tail of the
    launcher's output, both without the access-log lines of our readiness polling."""
    worker = worker_stderr(model_log)
    output = [line for line in launcher_output.splitlines() if _ACCESS_LOG not in line]
    parts = []
    if worker:
        parts.append("the model worker's stderr:\n" + "\n".join(worker)[-limit:])
    parts.append("the launcher's output:\n" + ("\n".join(output)[-limit:] or "(nothing)"))
    return "\n".join(parts)


class TorchServeProcess(RuntimeProcess):
    """TorchServe 0.12 from its own environment serving the bundled handler (or a
    user's: `handler`, the source of a handler module, served as `model`; or a user's
    archive, `archive`, at the values it registers with), started at `start`. Its own
    process group: a stop waits until the launcher, the Java front end and every worker
    have gone."""

    what = "TorchServe"
    port_names = ("inference", "management", "metrics", "grpc_inference", "grpc_management")
    inference_port = "inference"
    metrics_port_name = "metrics"

    def __init__(
        self,
        start: BatchingConfig,
        *,
        threads: int | None = None,
        ready_timeout_s: float = 120.0,
        stop_timeout_s: float = 15.0,
        model: str = MODEL,
        handler: bytes | None = None,
        archive: UserArchive | None = None,
    ) -> None:
        super().__init__(
            threads=threads, ready_timeout_s=ready_timeout_s, stop_timeout_s=stop_timeout_s
        )
        self.start_config = start
        self.native_start = to_native(KNOBS, start) if archive is None else dict(archive.baseline)
        self.model = model if archive is None else archive.name
        self._handler = handler
        self.archive = archive
        self.store: ModelStore | None = None

    @property
    def management_url(self) -> str:
        return self.address("management")

    async def _prepare(self) -> tuple[Path, dict[str, str]]:
        """The config.properties for a (re)start: ports chosen once, the start values
        registered from a new archive version in the store."""
        if self.root is None or self.store is None:
            root = await self._new_root("batchpilot-torchserve-")
            (root / "store").mkdir()
            if self.archive is not None:
                # unpacked once, out of the store: each version links its files
                extract_archive(self.archive, root / "archive")
                self.store = ArchiveStore(root / "store", self.archive, root / "archive")
            else:
                self.store = ModelStore(root / "store", self.model, self._handler)
        assert self.root is not None
        stale = self.store.versions()
        version, archive = self.store.add()
        for old in stale:
            self.store.remove(old)
        models = models_entry(self.model, str(version), archive, self.native_start)
        config = self.root / "config.properties"
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
            "TMPDIR": str(self.root),
            "TEMP": str(self.root),
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
        await self._start_on_ports(lambda: self._start_once(program))

    async def _start_once(self, program: Path) -> None:
        config, env = await self._prepare()
        assert self.root is not None
        try:
            await self._spawn(
                [str(program), "--start", "--foreground", "--ncs", "--ts-config", str(config)],
                env=env,
                cwd=self.root,  # its logs go to ./logs
            )
            await self._wait_worker()
        except LaunchError as exc:
            # read before stop() removes the folder the logs are in
            log = launch_log(self.stderr_tail(), self._model_log())
            await self.stop()
            raise LaunchError(f"TorchServe {exc} (on {self.url}); {log}") from None
        except BaseException:
            await self.stop()
            raise

    def handler_error(self) -> str:
        """The exception of the last traceback the model's worker logged ("" when none)."""
        return handler_exception(self._model_log())

    def _model_log(self) -> str:
        """logs/model_log.log of this instance ("" when it has none yet)."""
        if self.root is None:
            return ""
        path = self.root / "logs" / "model_log.log"
        try:
            with path.open("rb") as file:
                return read_tail(file, LOG_TAIL_BYTES * 4)
        except OSError:
            return ""

    async def _wait_worker(self) -> None:
        """Until the model's default version has a ready worker: TorchServe answers
        /ping "Healthy" before its worker has imported torch."""
        assert self._proc is not None
        deadline = time.monotonic() + self._ready_timeout_s
        url = f"{self.management_url}/models/{self.model}"
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

    async def _terminate(self, proc: asyncio.subprocess.Process) -> None:
        # Java and its workers first: the launcher waits for Java and reaps it, then
        # exits by itself (signalled first, it would leave Java an unreaped orphan)
        signal_all([pid for pid in group_members(proc.pid) if pid != proc.pid], signal.SIGTERM)
        members = functools.partial(group_members, proc.pid)
        if not await wait_gone(members, self._stop_timeout_s, _STOP_POLL_S):
            signal_group(proc.pid, signal.SIGKILL)
            await wait_gone(members, self._stop_timeout_s, _STOP_POLL_S)
        if proc.returncode is None:
            await proc.wait()

    async def stop(self) -> None:
        """Stop the whole process group and remove the temporary folder."""
        await super().stop()
        self.store = None
