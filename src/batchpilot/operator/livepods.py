"""The knobs live on the pods (apply.method Live, or a runtime adapter applied live):
read on one pod, applied and verified on every ready pod through apply.live's PUT and
GET or the runtime's own API, a pod that is (re)starting waited out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp

from batchpilot.errors import TargetError
from batchpilot.httpbody import MAX_CONTROL_BODY_BYTES, BodyTooLarge, json_capped, text_capped
from batchpilot.operator import decisions
from batchpilot.operator import runtimes as operator_runtimes
from batchpilot.operator.kubeworkload import Workload
from batchpilot.operator.spec import InferenceServiceSpec, Params, batching_config
from batchpilot.operator.world import TargetProblem
from batchpilot.runtimes.base import representable

if TYPE_CHECKING:
    from batchpilot.runtimes.base import Runtime

log = logging.getLogger(__name__)

# problems of a pod that is (re)starting: waited out rather than failing the trial
TRANSIENT = frozenset({"NoReadyPods", "AdminUnreachable", "AdminNotApplied"})


class LivePods:
    def __init__(
        self,
        workload: Workload,
        *,
        spec: InferenceServiceSpec,
        poll_s: float,
        http_timeout: aiohttp.ClientTimeout,
        settle_s: float,
    ) -> None:
        self._workload = workload
        self._spec = spec
        self._poll_s = poll_s
        self._http_timeout = http_timeout
        self._settle_s = settle_s
        # spec.runtime's adapter when it applies configurations live (None: apply.live
        # or the pod template)
        self.runtime = operator_runtimes.live_adapter(spec)

    async def read(self, ip: str) -> Params:
        """The knobs live on the pod at `ip`: apply.live, or the runtime's adapter."""
        if self.runtime is None:
            return await self.admin_get(ip)
        return await self.runtime_get(self.runtime, ip)

    def _admin_url(self, ip: str) -> str:
        live = self._spec.apply.live
        assert live is not None  # the spec's validation guarantees it for method Live
        # plain http even when the load is https: the spec keeps apply.live off an https
        # load port, so an admin port is never the TLS one
        return f"http://{ip}:{live.port}{live.path}"

    async def admin_get(self, ip: str) -> Params:
        """The pod's knobs from apply.live, read within the HTTP timeout (total) and
        MAX_CONTROL_BODY_BYTES: a longer answer is refused, not waited out."""
        url = self._admin_url(ip)
        async with aiohttp.ClientSession(timeout=self._http_timeout) as session:
            try:
                async with session.get(url) as response:
                    response.raise_for_status()
                    payload = await json_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=url)
            except BodyTooLarge as exc:
                raise TargetProblem("AdminRejected", f"GET {url}: {exc}") from None
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise TargetProblem("AdminUnreachable", f"GET {url}: {exc!r}") from exc
            except ValueError:
                raise TargetProblem("AdminRejected", f"GET {url} did not answer JSON") from None
        if not isinstance(payload, dict):
            raise TargetProblem(
                "AdminRejected",
                f"GET {url} answered {type(payload).__name__}, expected a JSON object",
            )
        return {k: v for k, v in payload.items() if isinstance(v, int | float)}

    async def runtime_get(self, runtime: Runtime, ip: str) -> Params:
        control = operator_runtimes.control_for(runtime, self._spec, ip)
        try:
            config = await control.current()
        except TargetError as exc:
            raise TargetProblem("AdminUnreachable", f"{runtime.title} at {ip}: {exc}") from exc
        return dict(config.model_dump())

    async def _runtime_apply(
        self, runtime: Runtime, ips: list[str], params: Mapping[str, float | int]
    ) -> None:
        """Apply through the runtime's adapter on every pod; its `apply` returns only once
        the configuration is verified live. A value the runtime cannot take fails at
        once; anything else (a pod restarting, a load under way) is waited out."""
        config = batching_config(dict(params))
        try:
            runtime.check(config)
        except ValueError as exc:
            raise TargetProblem("AdminRejected", f"{runtime.title}: {exc}") from None
        for ip in ips:
            control = operator_runtimes.control_for(runtime, self._spec, ip)
            try:
                await control.apply(config)
            except TargetError as exc:
                raise TargetProblem(
                    "AdminNotApplied", f"{runtime.title} at {ip}: {config.label()}: {exc}"
                ) from exc

    async def keep(
        self, workload: Mapping[str, Any], params: Mapping[str, float | int]
    ) -> list[str]:
        """Every ready pod that runs other values than `params` set to them again through
        the runtime's API and verified, as a trial's change is (a restarted or new pod
        starts from the model's own configuration): "POD (ran LABEL)" for each. A pod
        that cannot be read or set now (still loading its model) is left to the next
        check; nothing to do without a runtime applied live."""
        runtime = self.runtime
        if runtime is None:
            return []
        config = batching_config(dict(params))
        wanted = representable(runtime.knobs, config)
        kept: list[str] = []
        for name, ip in decisions.ready_pods(await self._workload.pods(workload)):
            control = operator_runtimes.control_for(runtime, self._spec, ip)
            try:
                running = await control.current()
                if running == wanted:
                    continue
                await control.apply(config)
            except TargetError as exc:
                log.info("%s at %s: live values not checked now: %s", name, ip, exc)
                continue
            kept.append(f"{name} (ran {running.label()})")
        return kept

    async def apply(self, workload: Mapping[str, Any], params: Mapping[str, float | int]) -> None:
        """Apply `params` on every ready pod and verify them: PUT and GET on apply.live,
        or the runtime adapter's apply. A pod that is restarting (no ready pods, refused
        connections: its status lags its process) is waited for, up to `settle_s`; a
        refusal by the server (4xx) fails at once."""
        name = workload["metadata"]["name"]
        last = "no attempt"
        try:
            async with asyncio.timeout(self._settle_s):
                while True:
                    ips = await self._workload.live_ips(workload)
                    try:
                        if not ips:
                            raise TargetProblem("NoReadyPods", f"{name} has no ready pods")
                        if self.runtime is None:
                            await self._put_and_verify(ips, params)
                        else:
                            await self._runtime_apply(self.runtime, ips, params)
                        return
                    except TargetProblem as problem:
                        if problem.reason not in TRANSIENT:
                            raise
                        last = problem.message
                    await asyncio.sleep(self._poll_s)
        except TimeoutError:
            raise TargetProblem(
                "AdminUnreachable", f"{name}: not live after {self._settle_s:g} s: {last}"
            ) from None

    async def _put_and_verify(self, ips: list[str], params: Mapping[str, float | int]) -> None:
        async with aiohttp.ClientSession(timeout=self._http_timeout) as session:
            for ip in ips:
                url = self._admin_url(ip)
                try:
                    async with session.put(url, json=dict(params)) as response:
                        if response.status >= 400:
                            text = (
                                await text_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=url)
                            )[:300]
                            raise TargetProblem(
                                "AdminRejected", f"PUT {url} → {response.status}: {text}"
                            )
                except BodyTooLarge as exc:
                    raise TargetProblem("AdminRejected", f"PUT {url}: {exc}") from None
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise TargetProblem("AdminUnreachable", f"PUT {url}: {exc!r}") from exc
                live = await self.admin_get(ip)
                wrong = {
                    k: (v, live.get(k))
                    for k, v in params.items()
                    if k in live and abs(float(live[k]) - float(v)) > 1e-9
                }
                if wrong:
                    raise TargetProblem(
                        "AdminNotApplied", f"{url} reports {wrong} (wanted, seen) after PUT"
                    )
