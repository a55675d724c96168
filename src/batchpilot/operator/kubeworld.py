"""The World on a real API server, composed of its parts: the target workload and its
rollouts (`kubeworkload`), the knobs live on the pods (`livepods`), the reads of
Prometheus (`promreads`), the events the world posts (`worldevents`), and the three
parts the study sees: the target (`kubetarget`), the canary (`kubecanary`) and the
trials (`kubetrials`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp

from batchpilot.operator import decisions
from batchpilot.operator.kube import Kube
from batchpilot.operator.kubecanary import KubeCanary
from batchpilot.operator.kubetarget import KubeTarget
from batchpilot.operator.kubetrials import KubeTrials
from batchpilot.operator.kubeworkload import Workload
from batchpilot.operator.livepods import LivePods
from batchpilot.operator.promreads import PrometheusReads
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.operator.world import ProblemSink
from batchpilot.operator.worldevents import EventPoster

if TYPE_CHECKING:
    from batchpilot.capacity.prometheus_http import AddressGuard


class KubeWorld:
    """A World on a real API server. A target of another kind brings its own workload
    and target parts (`parentworld.ParentWorld`)."""

    workload_type: type[Workload] = Workload
    target_type: type[KubeTarget] = KubeTarget
    trials_type: type[KubeTrials] = KubeTrials

    def __init__(
        self,
        kube: Kube,
        *,
        spec: InferenceServiceSpec,
        namespace: str,
        owner: Mapping[str, Any],
        on_problem: ProblemSink,
        poll_s: float = 2.0,
        http_timeout_s: float = 10.0,
        settle_s: float = 120.0,
        prometheus_guard: AddressGuard | None = None,
        probe_rps_per_pod: float = decisions.PROBE_RPS_PER_POD,
    ) -> None:
        http_timeout = aiohttp.ClientTimeout(total=http_timeout_s)
        self.workload = self.workload_type(
            kube,
            spec=spec,
            namespace=namespace,
            owner=owner,
            on_problem=on_problem,
            poll_s=poll_s,
        )
        self.events = EventPoster(kube, namespace=namespace, owner=owner)
        self.live = LivePods(
            self.workload, spec=spec, poll_s=poll_s, http_timeout=http_timeout, settle_s=settle_s
        )
        self.prometheus = PrometheusReads(self.workload, spec=spec, guard=prometheus_guard)
        self.canary = KubeCanary(
            kube, self.workload, self.events, spec=spec, namespace=namespace, owner=owner
        )
        self.trials = self.trials_type(
            kube,
            workload=self.workload,
            canary=self.canary,
            live=self.live,
            prometheus=self.prometheus,
            events=self.events,
            spec=spec,
            namespace=namespace,
            owner=owner,
            poll_s=poll_s,
            http_timeout=http_timeout,
        )
        self.target = self.target_type(
            workload=self.workload,
            live=self.live,
            prometheus=self.prometheus,
            spec=spec,
            poll_s=poll_s,
            requests_for=self.trials.request_protocol,
            probe_rps_per_pod=probe_rps_per_pod,
        )
