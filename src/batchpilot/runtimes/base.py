"""The adapter seam: what BatchingPilot needs to know and do per inference runtime.

The tuner and the simulator speak only `BatchingConfig` (canonical knobs: a batch cap
in requests and a queue wait in milliseconds) through `tuner.interfaces.Target` and
`Probe`. A runtime adapter translates: its knobs in native names and units, how the live
values are read, how a candidate is applied and verified, how a winner is persisted,
which request protocol the runtime speaks and which metrics give p99 and the request
rates. Adapters are found by name in `runtimes.registry`."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import (
    Annotated,
    ClassVar,
    Generic,
    Literal,
    NamedTuple,
    Protocol,
    Self,
    TypedDict,
    runtime_checkable,
)

from pydantic import Field, model_validator
from typing_extensions import TypeVar

from batchpilot.capacity.promql import Metrics
from batchpilot.loadgen.protocols import RequestProtocol
from batchpilot.models import MAX_BATCH_SIZE_LIMIT, MAX_QUEUE_TIME_MS_LIMIT, BatchingConfig, Frozen
from batchpilot.runtimes.http import DIRECT, HttpAccess

Canonical = Literal["max_batch_size", "max_queue_time_ms"]
Unit = Literal["requests", "s", "ms", "us"]
# how many of a unit make one millisecond
_PER_MS: Mapping[str, float] = {"s": 1e-3, "ms": 1.0, "us": 1e3}
HowApplied = Literal["live", "reload", "restart", "rollout"]
PersistKind = Literal["env", "args", "configmap", "serve-config", "recommend"]
NativeValues = dict[str, int | float]


class Launch(NamedTuple):
    """What a runtime's own server starts with: the configuration, the same in the
    runtime's terms, the CPU threads it may use (None: its default) and the bundled
    workload asked for (None: the first)."""

    start: BatchingConfig
    native: NativeValues
    threads: int | None
    workload: str | None


class Knob(Frozen):
    """One canonical knob as a runtime names and measures it. `minimum`/`maximum` are
    native bounds the runtime accepts; a value outside is refused before it is sent."""

    canonical: Canonical
    native: str
    unit: Unit
    integer: bool
    minimum: float
    maximum: float

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.canonical == "max_batch_size") != (self.unit == "requests"):
            raise ValueError("max_batch_size is counted in requests, the queue wait in time")
        if self.minimum > self.maximum:
            raise ValueError(f"{self.native}: minimum above maximum")
        return self

    def to_native(self, value: float) -> int | float:
        """The canonical value in this knob's unit (rounded to an integer where the
        runtime takes one). Raises ValueError when it falls outside the native bounds."""
        native = value if self.unit == "requests" else value * _PER_MS[self.unit]
        result: int | float = round(native) if self.integer else native
        if not (math.isfinite(result) and self.minimum <= result <= self.maximum):
            raise ValueError(
                f"{self.canonical}={value:g} is {self.native}={result:g} {self.unit}, outside "
                f"what the runtime takes ({self.minimum:g}..{self.maximum:g} {self.unit})"
            )
        return result

    def to_canonical(self, value: float) -> float:
        return value if self.unit == "requests" else value / _PER_MS[self.unit]


def batch_knob(native: str) -> Knob:
    """The batch cap as a runtime names it: whole requests, 1 to BatchPilot's limit."""
    return Knob(
        canonical="max_batch_size",
        native=native,
        unit="requests",
        integer=True,
        minimum=1,
        maximum=MAX_BATCH_SIZE_LIMIT,
    )


# BatchPilot's limit on the queue wait in each unit
_WAIT_LIMIT: Mapping[str, float] = {
    "s": MAX_QUEUE_TIME_MS_LIMIT / 1000.0,
    "ms": float(MAX_QUEUE_TIME_MS_LIMIT),
    "us": MAX_QUEUE_TIME_MS_LIMIT * 1000.0,
}


def wait_knob(native: str, unit: Literal["s", "ms", "us"], *, integer: bool = False) -> Knob:
    """The queue wait as a runtime names and measures it: 0 to BatchPilot's limit, in
    `unit` (whole ones where `integer`)."""
    return Knob(
        canonical="max_queue_time_ms",
        native=native,
        unit=unit,
        integer=integer,
        minimum=0.0,
        maximum=_WAIT_LIMIT[unit],
    )


def pinned_wait_knob(native: str) -> Knob:
    """The queue wait of a runtime that has none (continuous batching: a request joins
    the running batch at the next step): 0 ms, the only value it takes."""
    return Knob(
        canonical="max_queue_time_ms", native=native, unit="ms", integer=False, minimum=0, maximum=0
    )


def wait_pinned(knobs: Sequence[Knob]) -> bool:
    """Whether the runtime has no queue wait to turn (it is pinned at 0)."""
    return any(k.canonical == "max_queue_time_ms" and k.maximum == 0 for k in knobs)


def to_native(knobs: Sequence[Knob], config: BatchingConfig) -> NativeValues:
    """A canonical configuration in a runtime's names and units."""
    values = config.model_dump()
    return {k.native: k.to_native(values[k.canonical]) for k in knobs}


def from_native(knobs: Sequence[Knob], values: Mapping[str, float]) -> BatchingConfig:
    """The canonical configuration of native values; ValueError names a missing knob."""
    canonical: dict[str, float] = {}
    for knob in knobs:
        if knob.native not in values:
            raise ValueError(f"the runtime did not report {knob.native}")
        canonical[knob.canonical] = knob.to_canonical(float(values[knob.native]))
    return BatchingConfig(
        max_batch_size=round(canonical["max_batch_size"]),
        max_queue_time_ms=canonical["max_queue_time_ms"],
    )


def representable(knobs: Sequence[Knob], config: BatchingConfig) -> BatchingConfig:
    """`config` as the runtime will run it: through its units and rounding and back.
    Compare read-backs with this, not with the request."""
    return from_native(knobs, to_native(knobs, config))


class ControlEndpoint(Frozen):
    """The endpoint a runtime's control reaches besides the inference URL, which
    `tune --url ... --control-url URL` moves when it is not at the runtime's default."""

    what: str  # for people: "Triton's metrics endpoint (GET /metrics)"
    default: str  # where it is looked for without --control-url


class Persistence(Frozen):
    """How a winner survives a restart: where it is written and the exact text."""

    kind: PersistKind
    where: str  # e.g. "container env", "model-settings.json of model M"
    snippet: str


class Verification(Frozen):
    """What proved that a configuration is live after `apply`."""

    requested: BatchingConfig
    live: BatchingConfig  # read back from the runtime
    native: NativeValues  # the runtime's own values, in its names and units
    batch_sizes: dict[int, int] | None = None  # batch size -> batches seen, where exposed
    verified_by: Annotated[str, Field(min_length=1)]  # e.g. "read-back", "read-back, batches"
    change_s: float  # from the request to the configuration verified live


@runtime_checkable
class RuntimeControl(Protocol):
    """One running server of a runtime, reached over HTTP. Implements the tuner's
    `Target` (`current`, `apply`); `apply` returns only once the configuration is
    verified live and records how in `last_verification`."""

    last_verification: Verification | None

    async def current(self) -> BatchingConfig: ...

    async def native(self) -> NativeValues: ...

    async def apply(self, config: BatchingConfig) -> None: ...


@runtime_checkable
class Profiled(Protocol):
    """A control that can also report the server's per-batch-size compute statistics
    (the reference server's GET /admin/profile), from which the simulator proposes."""

    async def profile(self) -> dict[str, object]: ...


@runtime_checkable
class ShapesRequests(Protocol):
    """A control whose requests are built from the served model itself (its metadata):
    the load sends those too. `override` (the user's own body) replaces them."""

    async def request_protocol(
        self, override: RequestProtocol | None = None
    ) -> RequestProtocol: ...


@runtime_checkable
class PersistsAsRun(Protocol):
    """A control that knows what a configuration ran with beyond the two knobs (what it
    kept of the model's original configuration), so the persisted text is what was
    measured."""

    async def persistence(self, config: BatchingConfig) -> Persistence: ...


class LocalServer(Protocol):
    """A runtime started on this machine for `tune --local --runtime NAME`: bound to
    127.0.0.1 on free ports, ready when `start` returns, gone after `stop`."""

    @property
    def url(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def restart(self) -> None: ...

    async def exit_code(self, grace_s: float) -> int | None: ...

    def stderr_tail(self, limit: int = ...) -> str: ...


class LaunchError(RuntimeError):
    """A local runtime could not be started (not installed, exited, not ready in time);
    the message says why and what to do."""


class ControlOptions(TypedDict, total=False):
    """The keywords of `Runtime.control`, for a runtime that takes one more."""

    model: str | None
    server: LocalServer | None
    control_url: str | None
    access: HttpAccess


# covariant: a runtime typed by its own control and server is a Runtime
ControlT = TypeVar("ControlT", bound=RuntimeControl, default=RuntimeControl, covariant=True)
ServerT = TypeVar("ServerT", bound=LocalServer, default=LocalServer, covariant=True)


class Runtime(ABC, Generic[ControlT, ServerT]):
    """One inference runtime, whose control is a `ControlT` and whose local server a
    `ServerT`. Subclasses fill in the class attributes, `protocol`, `persistence` and the
    two hooks `_control` and `_launch`; everything else is derived."""

    name: ClassVar[str]  # the registry key and the --runtime value
    title: ClassVar[str]  # for people: "MLServer 1.7.1"
    knobs: ClassVar[tuple[Knob, Knob]]  # (max_batch_size, max_queue_time_ms)
    how_applied: ClassVar[HowApplied]
    metrics: ClassVar[Metrics]
    default_model: ClassVar[str | None]  # the bundled model's name, None: no models
    control_endpoint: ClassVar[ControlEndpoint]
    # what `launcher` starts, for its messages: "MLServer" serves "its bundled model M"
    server_name: ClassVar[str]
    serves: ClassVar[str]
    workloads: ClassVar[tuple[str, ...]] = ()  # what `launcher`'s `workload` may pick
    # what a user's model folder (`tune --local --model-dir DIR`) holds for this runtime,
    # or the file `user_model_flag` names, for people; None: `launcher` starts only the
    # bundled model
    user_model_dir: ClassVar[str | None] = None
    # the tune flag that gives the user's model: a folder, or a file (TorchServe's .mar)
    user_model_flag: ClassVar[str] = "--model-dir"
    # why a user's model takes only the requests of `tune --body-template` (BatchPilot
    # cannot build them), for people; None: they are built, or the runtime's own
    user_model_body: ClassVar[str | None] = None
    # its requests are OpenAI token streams (`protocol` an openai-stream one): a run
    # measures TTFT, TPOT, goodput and output tokens/s, and takes the stream flags
    streams_tokens: ClassVar[bool] = False

    @abstractmethod
    def protocol(self, model: str | None = None) -> RequestProtocol:
        """The requests the runtime serves, for `model` (default: the bundled one)."""

    def control(
        self,
        url: str,
        *,
        model: str | None = None,
        server: LocalServer | None = None,
        control_url: str | None = None,
        access: HttpAccess = DIRECT,
    ) -> ControlT:
        """A control for the server at base URL `url` serving `model` (default: the
        bundled one). `server` is the local server BatchPilot started from `launcher` (it
        gives access to what lives on this machine, such as a model repository); None for
        one running elsewhere. `control_url` is `control_endpoint` where it is not at its
        default. Every call it makes, to the control endpoint and to the server's
        inference path alike, carries `access`'s headers and verifies https by it."""
        return self._control(url, model or self.default_model, server, control_url, access)

    @abstractmethod
    def _control(
        self,
        url: str,
        model: str | None,
        server: LocalServer | None,
        control_url: str | None,
        access: HttpAccess,
    ) -> ControlT:
        """`control` with the model named (None only where there are no models)."""

    def launcher(
        self,
        start: BatchingConfig,
        *,
        threads: int | None = None,
        workload: str | None = None,
        model_dir: Path | None = None,
    ) -> ServerT:
        """A local server with the bundled model (`default_model`), starting at `start`;
        not yet started. `workload` picks among bundled models where a runtime has several
        (`workloads`; the reference server: mlp, encoder); others raise LaunchError for any
        value, as for a `start` the runtime cannot take. `model_dir`: serve the user's
        model in that folder (or file: `user_model_flag`) instead, starting at its own
        settings (`start` unused), where the runtime takes one (`user_model_dir`)."""
        if model_dir is not None:
            if workload is not None:
                raise LaunchError("a workload picks a bundled model; --model-dir gives your own")
            try:
                self.user_model(model_dir)
            except ValueError as exc:
                raise LaunchError(str(exc)) from None
            return self._launch_user(model_dir, threads)
        if workload is not None and workload not in self.workloads:
            raise LaunchError(f"{self.server_name} serves {self.serves}, not {workload!r}")
        try:
            native = self.native(start)
        except ValueError as exc:
            raise LaunchError(
                f"cannot start {self.server_name} at {start.label()}: {exc}"
            ) from None
        return self._launch(Launch(start, native, threads, workload))

    @abstractmethod
    def _launch(self, launch: Launch) -> ServerT:
        """`launcher` once the launch's workload and start (`native` in the runtime's
        terms) are known to be ones it takes."""

    def user_model(self, folder: Path) -> str:
        """The name of the user's model in `folder` (or file), once it is one this
        runtime can serve. ValueError says what is wrong and what is expected."""
        raise ValueError(
            f"{self.server_name} serves {self.serves} only: --model-dir is for runtimes "
            "that serve a model folder of your own"
        )

    def _launch_user(self, folder: Path, threads: int | None) -> ServerT:
        """`launcher` for the user's model in `folder` (checked by `user_model`)."""
        raise LaunchError(f"{self.server_name} serves {self.serves} only")

    @abstractmethod
    def persistence(self, config: BatchingConfig, *, model: str | None = None) -> Persistence:
        """How to make `config` survive a restart."""

    def unchangeable_from_elsewhere(self, model: str | None = None) -> str | None:
        """Why `tune --url` cannot change this runtime's batching on a server BatchPilot
        did not start, and how the user can set the values themselves; None where its
        control changes them over the network. Said before any request is sent."""
        return None

    def metrics_for(self, model: str | None = None) -> Metrics:
        """`metrics` narrowed to `model` where the runtime labels its series by model
        (default: the bundled one); the same for all models otherwise."""
        return self.metrics

    def native(self, config: BatchingConfig) -> NativeValues:
        return to_native(self.knobs, config)

    def canonical(self, values: Mapping[str, float]) -> BatchingConfig:
        return from_native(self.knobs, values)

    def check(self, config: BatchingConfig) -> None:
        """Raise ValueError when `config` cannot be expressed in this runtime's knobs."""
        to_native(self.knobs, config)

    def with_token_budget(self, tokens: int) -> Self:
        """This runtime with `tokens` as its per-step token budget (vLLM's
        max_num_batched_tokens); ValueError where the runtime has none."""
        raise ValueError(
            f"{self.server_name} has no token budget: it is vLLM's max_num_batched_tokens "
            "(--runtime vllm)"
        )

    def describe_knobs(self) -> str:
        return ", ".join(f"{k.canonical} -> {k.native} ({k.unit})" for k in self.knobs)
