"""The Prometheus source narrowed to the pods a trial measures: without it, a Canary
study with load.source prometheus would judge production's series, and an InPlace one
would mix every pod of the namespace into its rates."""

from __future__ import annotations

import re
from collections.abc import Sequence

from batchpilot.capacity.promql import join_matchers

# The label the Prometheus Operator's pod and service monitors put the pod's name in
# (load.prometheus.podLabel's default; other scrape setups relabel it elsewhere).
POD_LABEL = "pod"
# A pod's name is a DNS subdomain: nothing in it but '.' is special to a regex.
_POD_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def pods_matcher(pod_names: Sequence[str], label: str = POD_LABEL) -> str:
    """A PromQL matcher picking exactly `pod_names` (Prometheus anchors regex matches):
    pods_matcher(["a-1", "a-2"]) == 'pod=~"a-1|a-2"'. ValueError for no pods or a name
    that is not a pod's."""
    if not pod_names:
        raise ValueError("no pods to narrow the Prometheus queries to")
    bad = [n for n in pod_names if not _POD_NAME.match(n)]
    if bad:
        raise ValueError(f"not pod names: {', '.join(map(repr, bad))}")
    # '\\.' in a PromQL string is the regex '\.': a literal dot
    alternatives = "|".join(n.replace(".", "\\\\.") for n in sorted(set(pod_names)))
    return f'{label}=~"{alternatives}"'


def scoped_selector(selector: str, pod_names: Sequence[str], label: str = POD_LABEL) -> str:
    """The user's `load.prometheus.selector` with the pods' matcher on `label`
    (`load.prometheus.podLabel`) added."""
    return join_matchers(selector, pods_matcher(pod_names, label))
