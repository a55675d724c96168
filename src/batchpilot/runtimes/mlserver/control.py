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
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from batchpilot.errors import RequestShapeError, TargetError
from batchpilot.loadgen.protocols import JSON_HEADERS, RequestProtocol, v2_body, v2_path
from batchpilot.loadgen.v2model import (
    BODY_FLAG,
    REQUEST_FLAGS,
    MetadataError,
    fetch_v2_model,
    given_by,
    v2_model_protocol,
)
from batchpilot.models import BatchingConfig
from batchpilot.runtimes import base, burst
from batchpilot.runtimes.http import ControlClient
from batchpilot.runtimes.mlserver.user import (
    SETTINGS_FILE,
    UserModel,
    copy_model,
    persisted_settings,
    settings_native,
)

MODEL = "batchpilot-mlp"
MODEL_FILE = "mlserver_batch_model.py"
IMPLEMENTATION = "mlserver_batch_model.BatchRecordingMLP"
INPUT_NAME = "INPUT"
FEATURES = 8  # per row; the bundled model's input width
KNOBS: tuple[base.Knob, base.Knob] = (
    base.batch_knob("max_batch_size"),
    base.wait_knob("max_batch_time", "s"),
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
    of which only the newest is kept on disk. With `user`, each version is a copy of the
    user's model folder with the version's values in its model-settings.json (the user's
    folder is only read); else the bundled model's settings."""

    def __init__(self, root: Path, model: str = MODEL, *, user: UserModel | None = None) -> None:
        self.root = root
        self.user = user
        self.model = user.name if user is not None else model
        self.dir = root / self.model

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
        if self.user is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            copy_model(self.user, folder, native, version=version)
        else:
            folder.mkdir(parents=True)
            settings = model_settings(native, model=self.model, version=version)
            (folder / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")
        for v in old:
            shutil.rmtree(self.dir / f"v{v}")
        return version

    def written(self, version: int) -> base.NativeValues:
        """The values in the model-settings.json of `version` on disk (what MLServer read
        when it loaded that version). TargetError when it is not there."""
        path = self.dir / f"v{version}" / SETTINGS_FILE
        try:
            return settings_native(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise TargetError(f"cannot read {path}: {exc}") from None

    def rollback(self, previous: Mapping[str, float]) -> int:
        """Put `previous` back on disk as a new version (after a failed change)."""
        return self.write(previous)


class Observed(burst.Observed):
    """What one verification burst saw: the parameters of every answer, each with the
    rows of the batch it was computed in (`batch_rows`)."""

    batch_key = "batch_rows"


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


def _record(answer: Any) -> dict[str, Any] | None:
    """The bundled model's record in an answer: its parameters and the model version."""
    if not isinstance(answer, dict):
        return None
    params = dict(answer.get("parameters") or {})
    params["model_version"] = answer.get("model_version")
    return params if "batch_rows" in params else None


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
        self.last_verification: base.Verification | None = None

    async def burst(self, n: int) -> Observed:
        """`n` concurrent single-row inference requests; their answers' parameters (plus
        the model version). TargetError on any non-2xx answer."""
        answers = await burst.burst(
            self.url + v2_path(self.model),
            v2_body(1, input_name=INPUT_NAME, features=FEATURES),
            JSON_HEADERS,
            n,
            timeout_s=self._timeout_s,
            record=_record,
            bundled="bundled model",
        )
        return Observed(answers)

    async def native(self) -> base.NativeValues:
        answer = (await self.burst(1)).answers[0]
        return {
            "max_batch_size": int(answer["max_batch_size"]),
            "max_batch_time": float(answer["max_batch_time"]),
        }

    async def current(self) -> BatchingConfig:
        return base.from_native(KNOBS, await self.native())

    async def apply(self, config: BatchingConfig) -> None:
        if self.repository is None:
            raise TargetError(
                "this MLServer's model repository is not on this machine: BatchPilot can "
                "only recommend (write the model-settings.json shown) for it"
            )
        try:
            native = base.to_native(KNOBS, config)
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
        self, config: BatchingConfig, native: base.NativeValues, version: str, started: float
    ) -> base.Verification:
        n = burst.burst_size(int(native["max_batch_size"]))
        problems: list[str] = []
        for _ in range(self._verify_attempts):
            observed = await self.burst(n)
            problems = check_observed(observed, native, version)
            if not problems:
                return taken(
                    config,
                    native,
                    started,
                    f"model read-back (version {version}), adaptive batching "
                    f"{_on_off(native)}, batch sizes of {n} concurrent requests within the cap",
                    batch_sizes=observed.batch_sizes(),
                )
        raise TargetError(f"MLServer did not take {config.label()}: {'; '.join(problems)}")


def taken(
    config: BatchingConfig,
    native: base.NativeValues,
    started: float,
    verified_by: str,
    *,
    batch_sizes: dict[int, int] | None = None,
) -> base.Verification:
    """`config` verified as served with `native`, by what `verified_by` says."""
    return base.Verification(
        requested=config,
        live=base.from_native(KNOBS, native),
        native=native,
        batch_sizes=batch_sizes,
        verified_by=verified_by,
        change_s=time.monotonic() - started,
    )


def _on_off(native: base.NativeValues) -> str:
    return "on" if batching_on(native) else "off"


# --- a user's own model: verified by MLServer itself, never by the model's answers ---

# MLServer's own counter of the requests each model version answered (dataplane.py)
SUCCESS_METRIC = "model_infer_request_success_total"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def served_versions(index: object, model: str) -> dict[str, str]:
    """Version -> state of `model` in a `POST /v2/repository/index` answer (every
    version MLServer finds in its repository, with whether it is READY)."""
    if not isinstance(index, list):
        raise TargetError(f"MLServer's repository index is not a list: {str(index)[:200]}")
    found: dict[str, str] = {}
    for item in index:
        if isinstance(item, dict) and item.get("name") == model:
            found[str(item.get("version") or "")] = str(item.get("state") or "")
    return found


def index_problem(versions: Mapping[str, str], model: str, version: str) -> str | None:
    """What is wrong with the index for `model` serving only `version`, READY; None
    when that is what MLServer reports."""
    if versions == {version: "READY"}:
        return None
    return (
        f"MLServer's repository index shows model {model} at versions "
        f"[{versions_text(versions)}], expected {version} READY"
    )


def versions_text(versions: Mapping[str, str]) -> str:
    return ", ".join(f"{v or '-'} {s or '?'}" for v, s in sorted(versions.items())) or "none"


def answered(metrics: str, model: str, version: str) -> float:
    """How many requests MLServer counts as answered by `version` of `model` (its
    `model_infer_request_success_total{model, version}`; 0 when absent)."""
    total = 0.0
    for line in metrics.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match["name"] != SUCCESS_METRIC:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("model") == model and labels.get("version") == version:
            with contextlib.suppress(ValueError):
                total += float(match["value"])
    return total


def refused_message(status: int, text: str, model: str, *, given: str | None = None) -> str:
    """What to tell the user when MLServer refuses the requests for `model` with a 4xx
    (built from its metadata, or the user's own, which the flags `given` gave): the
    server's words and what to set."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    said = data["error"] if isinstance(data, dict) and "error" in data else text[:200]
    if given is not None:
        return (
            f"MLServer refused the {given} requests for model {model!r} (HTTP {status}: "
            f"{said}); give requests it accepts: {REQUEST_FLAGS}"
        )
    return (
        f"MLServer refused the requests built for model {model!r} from its metadata "
        f"(HTTP {status}: {said}); declare the model's inputs (name, datatype, shape) in "
        f"its {SETTINGS_FILE}, or give requests it accepts: {REQUEST_FLAGS}"
    )


def no_inputs_message(model: str, why: str) -> str:
    return (
        f"cannot build requests for model {model!r}: {why}. MLServer lists in a model's "
        f"metadata only the inputs its {SETTINGS_FILE} declares: add "
        '"inputs": [{"name": "<input>", "datatype": "FP32", "shape": [-1, <width>]}] '
        f"there, or give a sample request body with {BODY_FLAG}"
    )


class UserModelControl(MLServerControl):
    """The tuner's Target for a user's own model served from a local repository: each
    change a new version (a copy of the user's folder with the values in its
    model-settings.json), verified by MLServer itself: its repository index shows that
    version alone and READY, the model-settings.json it loaded holds the values, and
    its own counter says that version answered a burst of requests built from the
    model's metadata. Nothing is asked of the model's answers."""

    def __init__(
        self,
        url: str,
        *,
        repository: ModelRepository,
        metrics_url: str,
        timeout_s: float = 30.0,
        verify_attempts: int = 3,
    ) -> None:
        super().__init__(
            url,
            model=repository.model,
            repository=repository,
            timeout_s=timeout_s,
            verify_attempts=verify_attempts,
        )
        self.repo = repository
        self.metrics_url = metrics_url
        self.protocol: RequestProtocol | None = None
        self._given: str | None = None  # the flags that gave the user's own requests

    async def request_protocol(self, override: RequestProtocol | None = None) -> RequestProtocol:
        """The requests the model takes: `override` (the user's own body), else built
        once from the model's metadata. RequestShapeError says why none can be built and
        what to declare or give."""
        if override is not None:
            self.protocol = override
            self._given = given_by(override)
        if self.protocol is None:
            try:
                model = await fetch_v2_model(self.url, self.model, triton_config=False)
            except MetadataError as exc:
                raise RequestShapeError(no_inputs_message(self.model, str(exc))) from None
            try:
                self.protocol = v2_model_protocol(model)
            except MetadataError as exc:
                raise RequestShapeError(str(exc)) from None
        return self.protocol

    async def served(self) -> str:
        """The version MLServer serves the model at (alone and READY in its index)."""
        index = await self._client.call("POST", "/v2/repository/index", {})
        versions = served_versions(index, self.model)
        ready = [v for v, state in versions.items() if state == "READY"]
        if len(ready) != 1:
            raise TargetError(
                f"MLServer's repository index shows model {self.model} at versions "
                f"[{versions_text(versions)}], not one version READY"
            )
        return ready[0]

    async def native(self) -> base.NativeValues:
        """The values in the model-settings.json of the version MLServer serves."""
        version = await self.served()
        if not version.isdigit():
            raise TargetError(f"MLServer serves model {self.model} at version {version!r}")
        return self.repo.written(int(version))

    async def persistence(self, config: BatchingConfig) -> base.Persistence:
        """The user's own model-settings.json with `config`'s values in it."""
        user = self.repo.user
        assert user is not None  # a UserModelControl serves a user's folder
        try:
            native = base.to_native(KNOBS, config)
        except ValueError as exc:
            raise TargetError(str(exc)) from None
        return base.Persistence(
            kind="recommend",
            where=f"{user.folder / SETTINGS_FILE}: set max_batch_size and max_batch_time "
            "(seconds) as in this copy of it",
            snippet=json.dumps(persisted_settings(user, native), indent=2),
        )

    async def _answered(self, version: str) -> float | None:
        try:
            async with (
                aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=self._timeout_s)
                ) as session,
                session.get(self.metrics_url) as response,
            ):
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError):
            return None
        return answered(text, self.model, version) if response.status == 200 else None

    async def _send(self, n: int, protocol: RequestProtocol, version: str) -> None:
        """`n` concurrent requests of size 1 (`protocol`'s body) to `version` of the
        model by name, so MLServer answers them from that version or not at all and
        counts them under it; RequestShapeError on a 4xx (the requests are wrong for this
        model), TargetError on any other failure."""
        url = self.url + v2_path(self.model, version)

        def refused(status: int, text: str) -> TargetError:
            if 400 <= status < 500:
                return RequestShapeError(
                    refused_message(status, text, self.model, given=self._given)
                )
            return TargetError(f"POST {url} answered HTTP {status}: {text[:200]}")

        await burst.send(
            url,
            protocol.body(1),
            protocol.headers,
            n,
            timeout_s=self._timeout_s,
            refused=refused,
        )

    async def _verify(
        self, config: BatchingConfig, native: base.NativeValues, version: str, started: float
    ) -> base.Verification:
        protocol = await self.request_protocol()
        n = burst.burst_size(int(native["max_batch_size"]))
        problems: list[str] = []
        for _ in range(self._verify_attempts):
            problems = []
            index = await self._client.call("POST", "/v2/repository/index", {})
            problem = index_problem(served_versions(index, self.model), self.model, version)
            if problem is not None:
                problems.append(problem)
            loaded = self.repo.written(int(version))
            if loaded != native:
                problems.append(f"the model-settings.json of version {version} holds {loaded}")
            before = await self._answered(version)
            await self._send(n, protocol, version)
            after = await self._answered(version)
            counted = ""
            if before is not None and after is not None:
                if after - before < n:
                    problems.append(
                        f"MLServer counts {after - before:g} of {n} requests answered by "
                        f"version {version}"
                    )
                counted = f"; {n} requests to that version answered ({SUCCESS_METRIC})"
            if not problems:
                return taken(
                    config,
                    native,
                    started,
                    f"repository index: version {version} alone and READY, its "
                    f"{SETTINGS_FILE} read back (max_batch_size "
                    f"{int(native['max_batch_size'])}, max_batch_time "
                    f"{float(native['max_batch_time']):g} s: adaptive batching "
                    f"{_on_off(native)}){counted}",
                )
            await asyncio.sleep(0.2)
        raise TargetError(f"MLServer did not take {config.label()}: {'; '.join(problems)}")
