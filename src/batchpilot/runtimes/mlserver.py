"""MLServer 1.7.1: adaptive batching with `max_batch_size` (requests) and
`max_batch_time` (seconds), set per model in model-settings.json.

A change is a new model version: its folder is written beside the current one with the
new values, the current one's folder removed, and `POST /v2/repository/models/M/load`
asked for. MLServer then loads the new version through its full load path (adaptive
batching wrapped around it), makes it the default and unloads the stale one: requests
keep being served throughout. (Reloading the same version instead takes MLServer's
reload path, which skips the batching hook and silently serves every request alone.)

A change is verified by what the serving instance reports in each answer (the bundled
model puts its version, its settings, whether the batcher wraps it and the rows of the
batch into the response parameters), from a burst of concurrent requests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import IO, Any, ClassVar

import aiohttp

from batchpilot.capacity.promql import Metrics
from batchpilot.errors import TargetError
from batchpilot.loadgen.protocols import RequestProtocol, kserve_v2, v2_body, v2_path
from batchpilot.models import MAX_BATCH_SIZE_LIMIT, MAX_QUEUE_TIME_MS_LIMIT, BatchingConfig
from batchpilot.processes import (
    ChildProcess,
    NotReady,
    exit_code_of,
    free_ports,
    read_tail,
    signal_group,
    wait_ready,
)
from batchpilot.runtimes.base import (
    ControlEndpoint,
    HowApplied,
    Knob,
    LaunchError,
    LocalServer,
    NativeValues,
    Persistence,
    Runtime,
    Verification,
    from_native,
    to_native,
)
from batchpilot.runtimes.http import ControlClient
from batchpilot.runtimes.venvs import venv_executable

VENV = "mlserver-1.7.1"
MODEL = "batchpilot-mlp"
MODEL_FILE = "mlserver_batch_model.py"
IMPLEMENTATION = "mlserver_batch_model.BatchRecordingMLP"
INPUT_NAME = "INPUT"
FEATURES = 8  # per row; the bundled model's input width
SETTINGS_FILE = "model-settings.json"
# A verification burst: this many concurrent single-row requests per unit of batch cap,
# at most _BURST_MAX; enough for the batcher to fill batches if it is on.
_BURST_PER_BATCH = 2
_BURST_MIN = 8
_BURST_MAX = 64
_STDERR_TAIL = 4000

KNOBS: tuple[Knob, Knob] = (
    Knob(
        canonical="max_batch_size",
        native="max_batch_size",
        unit="requests",
        integer=True,
        minimum=1,
        maximum=MAX_BATCH_SIZE_LIMIT,
    ),
    Knob(
        canonical="max_queue_time_ms",
        native="max_batch_time",
        unit="s",
        integer=False,
        minimum=0.0,
        maximum=MAX_QUEUE_TIME_MS_LIMIT / 1000.0,
    ),
)


def batching_on(native: Mapping[str, float]) -> bool:
    """MLServer wraps its adaptive batcher around a model only when both knobs allow
    batching (batching/hooks.py: max_batch_size > 1 and max_batch_time > 0)."""
    return native["max_batch_size"] > 1 and native["max_batch_time"] > 0


def model_settings(native: Mapping[str, float], *, model: str, version: int) -> dict[str, Any]:
    """The model-settings.json of one version of the bundled model."""
    return {
        "name": model,
        "implementation": IMPLEMENTATION,
        "max_batch_size": int(native["max_batch_size"]),
        "max_batch_time": float(native["max_batch_time"]),
        "parameters": {"version": str(version)},
    }


class ModelRepository:
    """The folder MLServer serves `model` from: one subfolder per version (v1, v2, ...),
    of which only the newest is kept on disk."""

    def __init__(self, root: Path, model: str = MODEL) -> None:
        self.root = root
        self.model = model
        self.dir = root / model

    def versions(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        found = (p.name[1:] for p in self.dir.iterdir() if p.name.startswith("v"))
        return sorted(int(v) for v in found if v.isdigit())

    def write(self, native: Mapping[str, float]) -> int:
        """Write the next version with `native` values, remove the older ones from disk;
        the new version's number."""
        old = self.versions()
        version = (old[-1] + 1) if old else 1
        folder = self.dir / f"v{version}"
        folder.mkdir(parents=True)
        settings = model_settings(native, model=self.model, version=version)
        (folder / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")
        for v in old:
            shutil.rmtree(self.dir / f"v{v}")
        return version

    def rollback(self, previous: Mapping[str, float]) -> int:
        """Put `previous` back on disk as a new version (after a failed change)."""
        return self.write(previous)


class Observed:
    """What one verification burst saw: the parameters of every answer."""

    def __init__(self, answers: Sequence[Mapping[str, Any]]) -> None:
        self.answers = list(answers)

    def one(self, key: str) -> set[Any]:
        return {a.get(key) for a in self.answers}

    def batch_sizes(self) -> dict[int, int]:
        """Batch size -> batches: every request of a batch of n rows reports n."""
        rows = Counter(int(a["batch_rows"]) for a in self.answers)
        return {n: math.ceil(count / n) for n, count in sorted(rows.items())}


def check_observed(
    observed: Observed, native: Mapping[str, float], version: str | None
) -> list[str]:
    """What is wrong with the burst's answers for `native` values at `version`; empty
    when they prove the configuration live."""
    problems: list[str] = []
    if version is not None and observed.one("model_version") != {version}:
        problems.append(
            f"answers came from versions {sorted(map(str, observed.one('model_version')))}, "
            f"expected only {version}"
        )
    if observed.one("max_batch_size") != {int(native["max_batch_size"])}:
        problems.append(f"the model runs max_batch_size {sorted(observed.one('max_batch_size'))}")
    times = observed.one("max_batch_time")
    if len(times) != 1 or not math.isclose(
        float(next(iter(times))), float(native["max_batch_time"]), rel_tol=1e-9, abs_tol=1e-12
    ):
        problems.append(f"the model runs max_batch_time {sorted(times)}")
    expected = batching_on(native)
    if observed.one("adaptive_batching") != {expected}:
        problems.append(
            "adaptive batching is " + ("off" if expected else "on") + " in the serving model"
        )
    largest = max(observed.batch_sizes(), default=0)
    cap = int(native["max_batch_size"]) if expected else 1
    if largest > cap:
        problems.append(f"a batch of {largest} rows was served, above the cap of {cap}")
    return problems


class MLServerControl:
    """The tuner's Target for one MLServer. Changes need the model repository on this
    machine (`repository`); without one the control reads and verifies only."""

    def __init__(
        self,
        url: str,
        *,
        model: str = MODEL,
        repository: ModelRepository | None = None,
        control_url: str | None = None,
        timeout_s: float = 30.0,
        verify_attempts: int = 3,
    ) -> None:
        # the repository API; the read-back and verification go through inference (`url`)
        self._client = ControlClient(control_url or url, timeout_s=timeout_s)
        self.url = url.rstrip("/")
        self.model = model
        self.repository = repository
        self._timeout_s = timeout_s
        self._verify_attempts = verify_attempts
        self.last_verification: Verification | None = None

    async def burst(self, n: int) -> Observed:
        """`n` concurrent single-row inference requests; their answers' parameters (plus
        the model version). TargetError on any non-2xx answer."""
        url = self.url + v2_path(self.model)
        body = v2_body(1, input_name=INPUT_NAME, features=FEATURES)
        headers = {"Content-Type": "application/json"}
        timeout = aiohttp.ClientTimeout(total=self._timeout_s)

        async def one(session: aiohttp.ClientSession) -> Mapping[str, Any]:
            async with session.post(url, data=body, headers=headers) as response:
                text = await response.text()
                if response.status != 200:
                    raise TargetError(f"POST {url} answered HTTP {response.status}: {text[:200]}")
            data = json.loads(text)
            params = dict(data.get("parameters") or {})
            params["model_version"] = data.get("model_version")
            if "batch_rows" not in params:
                raise TargetError(
                    f"{url} does not report its batches (not the bundled model?): {text[:200]}"
                )
            return params

        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                answers = await asyncio.gather(*(one(session) for _ in range(n)))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise TargetError(f"inference on {url} failed: {exc or type(exc).__name__}") from exc
        return Observed(list(answers))

    async def native(self) -> NativeValues:
        answer = (await self.burst(1)).answers[0]
        return {
            "max_batch_size": int(answer["max_batch_size"]),
            "max_batch_time": float(answer["max_batch_time"]),
        }

    async def current(self) -> BatchingConfig:
        return from_native(KNOBS, await self.native())

    async def apply(self, config: BatchingConfig) -> None:
        if self.repository is None:
            raise TargetError(
                "this MLServer's model repository is not on this machine: BatchPilot can "
                "only recommend (write the model-settings.json shown) for it"
            )
        try:
            native = to_native(KNOBS, config)
        except ValueError as exc:
            raise TargetError(str(exc)) from None
        started = time.monotonic()
        previous = await self.native()
        version = self.repository.write(native)
        try:
            await self._load()
        except TargetError:
            self.repository.rollback(previous)
            with contextlib.suppress(TargetError):
                await self._load()
            raise
        self.last_verification = await self._verify(config, native, str(version), started)

    async def _load(self) -> None:
        await self._client.call(
            "POST", f"/v2/repository/models/{self.model}/load", {}, empty_ok=True
        )

    async def _verify(
        self, config: BatchingConfig, native: NativeValues, version: str, started: float
    ) -> Verification:
        n = min(max(_BURST_PER_BATCH * int(native["max_batch_size"]), _BURST_MIN), _BURST_MAX)
        problems: list[str] = []
        for _ in range(self._verify_attempts):
            observed = await self.burst(n)
            problems = check_observed(observed, native, version)
            if not problems:
                on = batching_on(native)
                return Verification(
                    requested=config,
                    live=from_native(KNOBS, native),
                    native=native,
                    batch_sizes=observed.batch_sizes(),
                    verified_by=(
                        f"model read-back (version {version}), adaptive batching "
                        + ("on" if on else "off")
                        + f", batch sizes of {n} concurrent requests within the cap"
                    ),
                    change_s=time.monotonic() - started,
                )
        raise TargetError(f"MLServer did not take {config.label()}: {'; '.join(problems)}")


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


# MLServer labels its HTTP figures with the route's template, the same for every model
INFER_PATH = 'path="/v2/models/{model_name}/infer"'


class MLServerRuntime(Runtime):
    name: ClassVar[str] = "mlserver"
    title: ClassVar[str] = "MLServer 1.7.1"
    knobs: ClassVar[tuple[Knob, Knob]] = KNOBS
    how_applied: ClassVar[HowApplied] = "reload"
    metrics: ClassVar[Metrics] = Metrics(
        port_note="metrics_port (default 8082), /metrics",
        latency_histogram="rest_server_request_duration_seconds",
        latency_unit="s",
        latency_matchers=INFER_PATH,
        # the HTTP layer's counters, not model_infer_request_*: those miss what never
        # reached the model (a 404 while it reloads, a request given up on)
        ok_requests=f'rest_server_requests_total{{{INFER_PATH},status_code=~"2.."}}',
        total_requests=f"rest_server_requests_total{{{INFER_PATH}}}",
    )
    default_model: ClassVar[str | None] = MODEL
    # MLServer has no management port: its repository API shares the inference port
    control_endpoint: ClassVar[ControlEndpoint] = ControlEndpoint(
        what="MLServer's model repository API (/v2/repository/models/M/load)",
        default="the inference URL itself",
    )

    def protocol(self, model: str | None = None) -> RequestProtocol:
        return kserve_v2(model or MODEL, input_name=INPUT_NAME, features=FEATURES)

    def control(
        self,
        url: str,
        *,
        model: str | None = None,
        server: LocalServer | None = None,
        control_url: str | None = None,
    ) -> MLServerControl:
        repository = server.repository if isinstance(server, MLServerProcess) else None
        return MLServerControl(
            url, model=model or MODEL, repository=repository, control_url=control_url
        )

    def launcher(
        self,
        start: BatchingConfig,
        *,
        threads: int | None = None,
        workload: str | None = None,
    ) -> MLServerProcess:
        if workload is not None:
            raise LaunchError(f"MLServer serves its bundled model {MODEL}, not {workload!r}")
        try:
            to_native(KNOBS, start)
        except ValueError as exc:
            raise LaunchError(f"cannot start MLServer at {start.label()}: {exc}") from None
        return MLServerProcess(start, threads=threads)

    def unchangeable_from_elsewhere(self, model: str | None = None) -> str:
        # MLServer 1.7.1's repository load (REST and gRPC) takes a model name and nothing
        # else; the settings come from the model-settings.json files it finds on disk
        name = model or MODEL
        return (
            f"{self.title} reads max_batch_size and max_batch_time only from the model's "
            f"{SETTINGS_FILE} when it loads the model (its repository API's load takes a "
            "model name and no settings, over HTTP and gRPC alike), so a server BatchPilot "
            "did not start cannot be changed from here. Tune the bundled model with "
            "--local --runtime mlserver, tune the Deployment through the operator "
            "(apply.method: Env), or set the values yourself: write "
            f'{{"name": "{name}", "max_batch_size": <requests>, "max_batch_time": '
            f'<seconds>, "parameters": {{"version": "<a new version>"}}}} into the '
            f"{SETTINGS_FILE} of a new version folder of model {name}, remove the serving "
            f"version's folder, and POST /v2/repository/models/{name}/load (a load of the "
            "version already loaded turns adaptive batching off)"
        )

    def persistence(self, config: BatchingConfig, *, model: str | None = None) -> Persistence:
        native = to_native(KNOBS, config)
        name = model or MODEL
        snippet = json.dumps(
            {
                "name": name,
                "max_batch_size": int(native["max_batch_size"]),
                "max_batch_time": float(native["max_batch_time"]),
            },
            indent=2,
        )
        return Persistence(
            kind="recommend",
            where=f"write model-settings.json of model {name} with these keys",
            snippet=snippet,
        )
