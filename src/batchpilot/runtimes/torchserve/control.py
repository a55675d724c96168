"""Changing and verifying TorchServe's batching while it serves.

TorchServe fixes `batch_size` and `max_batch_delay` when a model version is registered
(`PUT /models/M?batch_size=` is accepted and silently ignored). A change is therefore a
new version: its archive is written to the model store, registered with the new values
(synchronously, so its worker is up), made the default and the old version deleted;
requests keep being served by one version or the other throughout. A change is verified
by TorchServe itself: the management API's description of the model (the new version
the default, with the batchSize and maxBatchDelay asked for, every worker READY). The
handler's answers play no part, so a handler that does not report its batches tunes the
same; `burst` reads the bundled handler's reports for the tests that check the
management API's word against them."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from batchpilot.errors import RequestShapeError, TargetError
from batchpilot.loadgen.protocols import JSON_HEADERS, RequestProtocol
from batchpilot.loadgen.v2model import BODY_FLAG
from batchpilot.models import BatchingConfig
from batchpilot.runtimes import burst
from batchpilot.runtimes.base import (
    Knob,
    NativeValues,
    Persistence,
    Verification,
    batch_knob,
    from_native,
    to_native,
    wait_knob,
)
from batchpilot.runtimes.http import DIRECT, ControlClient, HttpAccess
from batchpilot.runtimes.torchserve.archive import archive_name, handler_source, model_archive
from batchpilot.runtimes.torchserve.user import (
    MANIFEST,
    UserArchive,
    link_tree,
    version_manifest,
)

MODEL = "batchpilot-mlp"
# How long an old version may take to finish what it was given before it is deleted anyway
_DRAIN_TIMEOUT_S = 10.0
_DRAIN_POLL_S = 0.05
_DRAIN_MARGIN_S = 0.25
_VERIFY_POLL_S = 0.5
_LOG_SETTLE_S = 0.5

KNOBS: tuple[Knob, Knob] = (
    batch_knob("batch_size"),
    # whole milliseconds: a canonical wait is rounded to the nearest ms (halves to even)
    wait_knob("max_batch_delay", "ms", integer=True),
)


def request_body(size: int) -> bytes:
    """The bundled handler's request: JSON {"size": N}."""
    return json.dumps({"size": size}).encode()


class ModelStore:
    """The model store folder of a TorchServe this machine started: one archive per
    registered version of the model (`<model>-v<N>.mar`) with `handler` (the source of a
    TorchServe handler module; default the bundled one)."""

    suffix = ".mar"

    def __init__(self, root: Path, model: str = MODEL, handler: bytes | None = None) -> None:
        self.root = root
        self.model = model
        self._handler = handler_source() if handler is None else handler

    def entry(self, version: int) -> str:
        """What `url=` names to register `version`: its archive's file name."""
        return archive_name(self.model, version)

    def versions(self) -> list[int]:
        prefix = f"{self.model}-v"
        found = (
            p.name.removeprefix(prefix).removesuffix(self.suffix)
            for p in self.root.glob(f"{prefix}*{self.suffix}")
        )
        return sorted(int(v) for v in found if v.isdigit())

    def add(self) -> tuple[int, str]:
        """Write the next version; (version, what `url=` names to register it)."""
        old = self.versions()
        version = (old[-1] + 1) if old else 1
        name = self.entry(version)
        self._write(version, self.root / name)
        return version, name

    def _write(self, version: int, path: Path) -> None:
        path.write_bytes(model_archive(self.model, version, self._handler))

    def remove(self, version: int) -> None:
        (self.root / self.entry(version)).unlink(missing_ok=True)


class ArchiveStore(ModelStore):
    """The model store of a TorchServe serving a user's archive: one folder per version
    (`<model>-v<N>`, which TorchServe registers from the store as it does a .mar), the
    archive's files (unpacked once into `source`) linked into it with the manifest's
    modelVersion set to N. The user's archive is only read."""

    suffix = ""

    def __init__(self, root: Path, archive: UserArchive, source: Path) -> None:
        super().__init__(root, archive.name, handler=b"")  # the archive brings its own
        self.archive = archive
        self.source = source

    def entry(self, version: int) -> str:
        return f"{self.model}-v{version}"

    def _write(self, version: int, path: Path) -> None:
        link_tree(self.source, path)
        manifest = path / MANIFEST
        manifest.unlink()  # a link: the source's manifest stays as the user's
        manifest.write_text(json.dumps(version_manifest(self.archive, version), indent=4))

    def remove(self, version: int) -> None:
        shutil.rmtree(self.root / self.entry(version), ignore_errors=True)


def default_version(described: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The entry of `GET /models/M` (it describes the default version); TargetError when
    the answer is not a description."""
    if not described or not isinstance(described[0], Mapping) or "batchSize" not in described[0]:
        raise TargetError(f"TorchServe described the model as {str(described)[:200]}")
    return described[0]


def described_native(entry: Mapping[str, Any]) -> NativeValues:
    return {"batch_size": int(entry["batchSize"]), "max_batch_delay": int(entry["maxBatchDelay"])}


def pending_requests(entry: Mapping[str, Any]) -> int:
    return int((entry.get("jobQueueStatus") or {}).get("pendingRequests", 0))


def ready_workers(entry: Mapping[str, Any]) -> int:
    return sum(1 for w in entry.get("workers") or [] if w.get("status") == "READY")


def worker_states(entry: Mapping[str, Any]) -> list[str]:
    return [str(w.get("status")) for w in entry.get("workers") or []]


class Observed(burst.Observed):
    """The answers of one verification burst (the handler's record of each batch, with
    the requests in it: `batch_requests`)."""

    batch_key = "batch_requests"


def check_described(
    entry: Mapping[str, Any], native: Mapping[str, float], version: str
) -> list[str]:
    """What is wrong with the default version's description for `native` at `version`."""
    problems = []
    if str(entry.get("modelVersion")) != version:
        problems.append(f"the default version is {entry.get('modelVersion')}, expected {version}")
    if described_native(entry) != {k: int(v) for k, v in native.items()}:
        problems.append(
            f"it runs batchSize {entry['batchSize']}, maxBatchDelay {entry['maxBatchDelay']}"
        )
    states = worker_states(entry)
    if not states or ready_workers(entry) < len(states):
        problems.append(
            f"its workers are {', '.join(states)}" if states else "it has no ready worker"
        )
    return problems


def check_observed(observed: Observed, native: Mapping[str, float], version: str) -> list[str]:
    """What is wrong with the burst's answers for `native` at `version`; empty when they
    prove the configuration serves."""
    problems = []
    if observed.one("model_version") != {version}:
        versions = sorted(map(str, observed.one("model_version")))
        problems.append(f"answers came from versions {versions}, expected only {version}")
    cap = int(native["batch_size"])
    if observed.one("batch_size") != {cap}:
        problems.append(f"the worker runs batch_size {sorted(observed.one('batch_size'))}")
    largest = max(observed.batch_sizes(), default=0)
    if largest > cap:
        problems.append(f"a batch of {largest} requests was served, above the cap of {cap}")
    return problems


def _record(answer: Any) -> dict[str, Any] | None:
    return answer if isinstance(answer, dict) and "batch_requests" in answer else None


class TorchServeControl:
    """The tuner's Target for one TorchServe: `url` its inference address, `management`
    its management address. Changes need the model store on this machine (`store`);
    without one the control reads and verifies only (recommend-only)."""

    def __init__(
        self,
        url: str,
        *,
        management: str,
        model: str = MODEL,
        store: ModelStore | None = None,
        timeout_s: float = 60.0,
        verify_attempts: int = 20,
        access: HttpAccess = DIRECT,
    ) -> None:
        self.url = url.rstrip("/")
        self.access = access
        self._management = ControlClient(management, timeout_s=timeout_s, access=access)
        self.model = model
        self.store = store
        self._timeout_s = timeout_s
        self._verify_attempts = verify_attempts
        self.last_verification: Verification | None = None

    async def describe(self) -> Mapping[str, Any]:
        """The management API's description of the model's default version."""
        described = await self._management.call("GET", f"/models/{self.model}")
        return default_version(described if isinstance(described, list) else [])

    async def versions(self) -> list[str]:
        described = await self._management.call("GET", f"/models/{self.model}/all")
        return [str(entry["modelVersion"]) for entry in described]

    async def native(self) -> NativeValues:
        return described_native(await self.describe())

    async def current(self) -> BatchingConfig:
        return from_native(KNOBS, await self.native())

    async def burst(self, n: int) -> Observed:
        """`n` concurrent single-row requests; the handler's record from each answer.
        TargetError on any non-2xx answer or an answer without the record."""
        answers = await burst.burst(
            f"{self.url}/predictions/{self.model}",
            request_body(1),
            JSON_HEADERS,
            n,
            timeout_s=self._timeout_s,
            record=_record,
            bundled="bundled handler",
            access=self.access,
        )
        return Observed(answers)

    async def apply(self, config: BatchingConfig) -> None:
        if self.store is None:
            raise TargetError(
                "this TorchServe's model store is not on this machine: BatchPilot can only "
                "recommend (register the model with the values shown) for it"
            )
        try:
            native = to_native(KNOBS, config)
        except ValueError as exc:
            raise TargetError(str(exc)) from None
        started = time.monotonic()
        old = await self.versions()
        version, archive = self.store.add()
        query = urlencode(
            {
                "url": archive,
                "model_name": self.model,
                "batch_size": int(native["batch_size"]),
                "max_batch_delay": int(native["max_batch_delay"]),
                "initial_workers": 1,
                "synchronous": "true",
            }
        )
        try:
            await self._management.call("POST", f"/models?{query}")
        except TargetError:
            self.store.remove(version)
            raise
        try:
            await self._management.call("PUT", f"/models/{self.model}/{version}/set-default")
        except TargetError:
            await self._management.call("DELETE", f"/models/{self.model}/{version}")
            self.store.remove(version)
            raise
        for stale in old:
            await self._drain(stale)
            await self._management.call("DELETE", f"/models/{self.model}/{stale}")
            if stale.isdigit():
                self.store.remove(int(stale))
        self.last_verification = await self._verify(config, native, str(version), started)

    async def _drain(self, version: str) -> None:
        """Wait until `version` (no longer the default) has no request queued, and then
        for one more batch window: TorchServe's DELETE drops what the version still
        holds, and its clients get errors or no answer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _DRAIN_TIMEOUT_S
        while loop.time() < deadline:
            described = await self._management.call("GET", f"/models/{self.model}/{version}")
            entry = default_version(described if isinstance(described, list) else [])
            if pending_requests(entry) == 0:
                # what a worker took from the queue last is still in its batch
                await asyncio.sleep(int(entry["maxBatchDelay"]) / 1000.0 + _DRAIN_MARGIN_S)
                return
            await asyncio.sleep(_DRAIN_POLL_S)

    async def _verify(
        self, config: BatchingConfig, native: NativeValues, version: str, started: float
    ) -> Verification:
        """The management API's description, polled until every worker of the new
        version is READY (registration is synchronous, so this is usually at once)."""
        problems: list[str] = []
        for attempt in range(self._verify_attempts):
            if attempt:
                await asyncio.sleep(_VERIFY_POLL_S)
            entry = await self.describe()
            problems = check_described(entry, native, version)
            if not problems:
                workers = len(worker_states(entry))
                return Verification(
                    requested=config,
                    live=from_native(KNOBS, native),
                    native=native,
                    verified_by=(
                        f"management describe (version {version}: batchSize "
                        f"{native['batch_size']}, maxBatchDelay {native['max_batch_delay']} ms, "
                        f"{workers} worker(s) READY)"
                    ),
                    change_s=time.monotonic() - started,
                )
        raise TargetError(f"TorchServe did not take {config.label()}: {'; '.join(problems)}")


class Refused(TargetError):
    """An answer that was not 2xx, with TorchServe's status and words."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:200]}")
        self.status = status
        self.text = text


def refused_message(status: int, text: str, model: str, *, handler_said: str = "") -> str:
    """What to tell the user when TorchServe answers the --body-template requests for
    `model` with `status`: its words, the exception the handler raised where its log has
    one (TorchServe answers any with 503 "Prediction failed") and what to set."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    said = data["message"] if isinstance(data, dict) and "message" in data else text[:200]
    message = (
        f"TorchServe answered HTTP {status} to the {BODY_FLAG} requests for model "
        f"{model!r} ({said})"
    )
    if handler_said:
        message += f"; the handler raised {handler_said}"
    return message + f"; give a request body your handler accepts with {BODY_FLAG}"


def needs_template_message(model: str) -> str:
    return (
        "TorchServe hands each request's body to the handler as it is, so BatchPilot "
        f"cannot build the requests of model {model!r}: pass {BODY_FLAG} FILE with one "
        "request body your handler accepts (a {size} in it becomes each request's size)"
    )


class UserArchiveControl(TorchServeControl):
    """The tuner's Target for a user's own archive served by a TorchServe this machine
    started: each change a new version from the store (`ArchiveStore`), verified by
    TorchServe itself, as for the bundled handler (the management API's description of
    the new version: the default, its batchSize and maxBatchDelay, every worker READY),
    and by a burst of the user's requests to that version answered 2xx. Nothing is read
    from the answers. The requests are the user's --body-template: a handler's input is
    its own. `handler_log` gives the exception the handler last raised, for refusals."""

    def __init__(
        self,
        url: str,
        *,
        management: str,
        store: ArchiveStore,
        handler_log: Callable[[], str] | None = None,
        timeout_s: float = 60.0,
        verify_attempts: int = 20,
        access: HttpAccess = DIRECT,
    ) -> None:
        super().__init__(
            url,
            management=management,
            model=store.model,
            store=store,
            timeout_s=timeout_s,
            verify_attempts=verify_attempts,
            access=access,
        )
        self.archive = store.archive
        self.protocol: RequestProtocol | None = None
        self._handler_log = handler_log
        self._answered = False  # a burst was answered: later refusals are the server's

    async def request_protocol(self, override: RequestProtocol | None = None) -> RequestProtocol:
        """The user's --body-template (`override`); RequestShapeError without one."""
        if override is not None:
            self.protocol = override
        if self.protocol is None:
            raise RequestShapeError(needs_template_message(self.model))
        return self.protocol

    async def persistence(self, config: BatchingConfig) -> Persistence:
        """The archive's model-config.yaml lines, or its registration with the values."""
        try:
            native = to_native(KNOBS, config)
        except ValueError as exc:
            raise TargetError(str(exc)) from None
        mar = self.archive.path.name
        size, delay = int(native["batch_size"]), int(native["max_batch_delay"])
        return Persistence(
            kind="recommend",
            where=(
                f"the model-config.yaml of {mar} (torch-model-archiver --config-file), "
                "read when the archive is registered without values, or the values given "
                "at registration, which win over it"
            ),
            snippet=(
                f"batchSize: {size}\nmaxBatchDelay: {delay}\n"
                f"# or at run time: POST /models?url={mar}&batch_size={size}"
                f"&max_batch_delay={delay}&initial_workers=1"
            ),
        )

    async def _verify(
        self, config: BatchingConfig, native: NativeValues, version: str, started: float
    ) -> Verification:
        verification = await super()._verify(config, native, version, started)
        protocol = await self.request_protocol()
        n = burst.burst_size(int(native["batch_size"]))
        first = not self._answered
        try:
            await burst.send(
                f"{self.url}/predictions/{self.model}/{version}",
                protocol.body(1),
                protocol.headers,
                n,
                timeout_s=self._timeout_s,
                refused=Refused,
                access=self.access,
            )
        except Refused as exc:
            said = await self._handler_said()
            message = refused_message(exc.status, exc.text, self.model, handler_said=said)
            # never answered yet: the requests are the suspect, whatever the status
            if first or exc.status < 500:
                raise RequestShapeError(message) from None
            raise TargetError(message) from None
        self._answered = True
        return verification.model_copy(
            update={
                "verified_by": f"{verification.verified_by}; {n} requests to that version "
                "answered 2xx",
                "change_s": time.monotonic() - started,
            }
        )

    async def _handler_said(self) -> str:
        if self._handler_log is None:
            return ""
        # the front end copies the worker's log lines a moment after it answers
        await asyncio.sleep(_LOG_SETTLE_S)
        return self._handler_log()
