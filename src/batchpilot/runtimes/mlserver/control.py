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

import contextlib
import json
import math
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from batchpilot.errors import TargetError
from batchpilot.loadgen.protocols import JSON_HEADERS, v2_body, v2_path
from batchpilot.models import BatchingConfig
from batchpilot.runtimes import base, burst
from batchpilot.runtimes.http import ControlClient

MODEL = "batchpilot-mlp"
MODEL_FILE = "mlserver_batch_model.py"
IMPLEMENTATION = "mlserver_batch_model.BatchRecordingMLP"
INPUT_NAME = "INPUT"
FEATURES = 8  # per row; the bundled model's input width
SETTINGS_FILE = "model-settings.json"
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
                on = batching_on(native)
                return base.Verification(
                    requested=config,
                    live=base.from_native(KNOBS, native),
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
