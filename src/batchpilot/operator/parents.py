"""Targets whose serving pods belong to a parent: a KServe InferenceService or a
RayService. Their controllers own the Deployment or RayCluster underneath and revert
any change made there, so the operator finds the pods through the parent and writes the
knobs to the parent, never to the child. Pure functions of the objects read; the
API calls are in `batchpilot.operator.parentworld`.

KServe: the predictor's environment (`spec.predictor.containers[i].env`, or
`spec.predictor.<framework>.env` for a framework predictor such as `triton`), written by
server-side apply; KServe rolls the predictor out. RayService: the Serve deployment's
`user_config` inside `spec.serveConfigV2` (a YAML string); KubeRay hands a changed
user_config to the running replicas' `reconfigure()`, no restart.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

import yaml

from batchpilot.errors import TargetError
from batchpilot.operator import decisions
from batchpilot.operator import runtimes as operator_runtimes
from batchpilot.operator.kube import workload_path
from batchpilot.operator.spec import (
    MAX_BATCH_SIZE,
    MAX_QUEUE_TIME_MS,
    InferenceServiceSpec,
    Params,
    TargetRef,
)
from batchpilot.operator.status import OriginalConfig
from batchpilot.runtimes.rayserve.config import BATCH_KEY, WAIT_KEY, split_model

PLURALS = {"InferenceService": "inferenceservices", "RayService": "rayservices"}
KSERVE_LABEL = "serving.kserve.io/inferenceservice"
KSERVE_COMPONENT_LABEL = "component"
KSERVE_PREDICTOR = "predictor"
# The name KServe gives the model container of a framework predictor.
KSERVE_CONTAINER = "kserve-container"
# Predictor fields that each describe the model container (v1beta1).
KSERVE_FRAMEWORKS = (
    "model",
    "triton",
    "sklearn",
    "xgboost",
    "tensorflow",
    "pytorch",
    "onnx",
    "pmml",
    "lightgbm",
    "paddle",
    "huggingface",
)
RAY_CLUSTER_LABEL = "ray.io/cluster"
# KubeRay sets it on the pods whose Serve proxy is healthy: the ones its serve Service
# sends traffic to.
RAY_SERVE_LABEL = "ray.io/serve"
# KubeRay's "head" or "worker" on every pod of a RayCluster
RAY_NODE_TYPE_LABEL = "ray.io/node-type"


class ParentProblem(TargetError):
    """The parent cannot be used as it is; `reason` is CamelCase for conditions."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def target_path(target: TargetRef, namespace: str) -> str:
    """The API path of the target itself: a workload or a parent."""
    if not target.is_parent:
        return workload_path(target.kind, namespace, target.name)
    return parent_path(target.api_version, target.kind, namespace, target.name)


def parent_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    return f"/apis/{api_version}/namespaces/{quote(namespace)}/{PLURALS[kind]}/{quote(name)}"


def _name(parent: Mapping[str, Any]) -> str:
    return str(parent.get("metadata", {}).get("name", "?"))


def pod_selector(parent: Mapping[str, Any]) -> str:
    """The label selector of the parent's serving pods."""
    kind = parent.get("kind")
    if kind == "InferenceService":
        return f"{KSERVE_LABEL}={_name(parent)},{KSERVE_COMPONENT_LABEL}={KSERVE_PREDICTOR}"
    if kind == "RayService":
        return f"{RAY_CLUSTER_LABEL}={active_ray_cluster(parent)},{RAY_SERVE_LABEL}=true"
    raise ValueError(f"{kind} is not a parent kind; parents are {', '.join(PLURALS)}")


def head_selector(rayservice: Mapping[str, Any]) -> str:
    """The label selector of the head pod of the RayService's active cluster, where
    Ray's dashboard serves the Serve REST API."""
    return f"{RAY_CLUSTER_LABEL}={active_ray_cluster(rayservice)},{RAY_NODE_TYPE_LABEL}=head"


def head_pods(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods labelled as a Ray head among `pods`."""
    return [
        p
        for p in pods
        if (p.get("metadata", {}).get("labels") or {}).get(RAY_NODE_TYPE_LABEL) == "head"
    ]


def active_ray_cluster(rayservice: Mapping[str, Any]) -> str:
    """The RayCluster serving now; a pending one (during KubeRay's zero-downtime
    upgrade) takes no traffic yet, so it is not measured."""
    status = rayservice.get("status") or {}
    name = (status.get("activeServiceStatus") or {}).get("rayClusterName")
    if not name:
        raise ParentProblem(
            "NoActiveRayCluster",
            f"RayService {_name(rayservice)} reports no active RayCluster "
            "(status.activeServiceStatus.rayClusterName) yet",
        )
    return str(name)


# --- KServe: the predictor's environment ---------------------------------------------


@dataclass(frozen=True)
class PredictorSlot:
    """Where the model container sits in a KServe predictor: `containers[index]` or a
    framework field; `container` is its name in the pods."""

    field: str  # "containers" or a framework, e.g. "triton"
    index: int | None
    container: str
    env: tuple[Mapping[str, Any], ...]


def predictor_slot(isvc: Mapping[str, Any], container: str | None) -> PredictorSlot:
    """The predictor's model container, by name (`target.container`) or the first."""
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    containers = predictor.get("containers") or []
    if containers:
        for index, entry in enumerate(containers):
            name = str(entry.get("name") or KSERVE_CONTAINER)
            if container is None or name == container:
                return PredictorSlot("containers", index, name, tuple(entry.get("env") or ()))
        names = [str(c.get("name") or KSERVE_CONTAINER) for c in containers]
        raise ParentProblem(
            "ContainerNotFound",
            f"InferenceService {_name(isvc)} has no predictor container {container}; "
            f"it has {', '.join(names)}",
        )
    for framework in KSERVE_FRAMEWORKS:
        entry = predictor.get(framework)
        if isinstance(entry, Mapping):
            if container is not None and container != KSERVE_CONTAINER:
                raise ParentProblem(
                    "ContainerNotFound",
                    f"InferenceService {_name(isvc)} has a {framework} predictor, whose "
                    f"container is {KSERVE_CONTAINER}, not {container}",
                )
            return PredictorSlot(framework, None, KSERVE_CONTAINER, tuple(entry.get("env") or ()))
    raise ParentProblem(
        "ContainerNotFound",
        f"InferenceService {_name(isvc)} has no spec.predictor.containers and none of "
        f"spec.predictor.{{{','.join(KSERVE_FRAMEWORKS)}}}",
    )


def merged_env(
    current: Sequence[Mapping[str, Any]], env: Mapping[str, str | None]
) -> list[dict[str, Any]]:
    """`current` with the named variables set to their values, or removed where the
    value is None; the order of the others is kept."""
    result: list[dict[str, Any]] = []
    seen: set[str] = set()
    for entry in current:
        name = str(entry.get("name"))
        if name not in env:
            result.append(dict(entry))
            continue
        seen.add(name)
        value = env[name]
        if value is not None:
            result.append({"name": name, "value": value})
    result += [
        {"name": k, "value": v} for k, v in sorted(env.items()) if k not in seen and v is not None
    ]
    return result


def kserve_env_patch(
    isvc: Mapping[str, Any], slot: PredictorSlot, env: Mapping[str, str | None]
) -> dict[str, Any]:
    """A server-side apply body that sets these variables on the predictor. A CRD that
    keeps unknown fields makes every list atomic, so the body carries the whole list
    (the env, or every container for `containers`), which is right for list-map
    schemas as well."""
    meta = isvc.get("metadata", {})
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    variables = merged_env(slot.env, env)
    if slot.field == "containers":
        containers = [json.loads(json.dumps(c)) for c in predictor.get("containers") or []]
        assert slot.index is not None  # predictor_slot sets it for containers
        containers[slot.index]["env"] = variables
        body: dict[str, Any] = {"containers": containers}
    else:
        body = {slot.field: {"env": variables}}
    return {
        "apiVersion": isvc.get("apiVersion"),
        "kind": isvc.get("kind"),
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "spec": {"predictor": body},
    }


def kserve_original(
    isvc: Mapping[str, Any], spec: InferenceServiceSpec, now: datetime
) -> OriginalConfig:
    slot = predictor_slot(isvc, spec.target.container)
    names = spec.env_names()
    env = decisions.env_values({"env": list(slot.env)}, names.values())
    params = decisions.params_from_env(env, names, operator_runtimes.env_wait(spec)) or {}
    return OriginalConfig(params=decisions.with_pinned_wait(params, spec), env=env, recorded_at=now)


def pods_rollout(
    pods: Sequence[Mapping[str, Any]], container: str, env: Mapping[str, str | None] | None
) -> decisions.Rollout:
    """Whether every pod of the parent runs `env` (None: any) and is ready. The child
    Deployment is the parent controller's business; the pods say what runs."""
    if not pods:
        return decisions.Rollout(False, "no pods yet")
    terminating = [p for p in pods if p.get("metadata", {}).get("deletionTimestamp")]
    if terminating:
        return decisions.Rollout(False, f"{len(terminating)} old pods still terminating")
    if env is not None:
        stale = 0
        for pod in pods:
            spec = pod.get("spec") or {}
            found: Mapping[str, Any] = next(
                (c for c in spec.get("containers") or [] if c.get("name") == container), {}
            )
            if decisions.env_values(found, env) != dict(env):
                stale += 1
        if stale:
            return decisions.Rollout(
                False, f"{stale} of {len(pods)} pods still run another environment"
            )
    ready = len(decisions.ready_pod_ips(pods))
    if ready < len(pods):
        return decisions.Rollout(False, f"{ready} of {len(pods)} pods ready")
    return decisions.Rollout(True, f"{len(pods)} pods run the configuration and are ready")


# --- RayService: serveConfigV2's user_config -----------------------------------------


def serve_config(rayservice: Mapping[str, Any]) -> dict[str, Any]:
    raw = (rayservice.get("spec") or {}).get("serveConfigV2")
    if not isinstance(raw, str) or not raw.strip():
        raise ParentProblem(
            "ServeConfigMissing",
            f"RayService {_name(rayservice)} has no spec.serveConfigV2 to carry the knobs",
        )
    try:
        config = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ParentProblem(
            "ServeConfigInvalid", f"RayService {_name(rayservice)}: serveConfigV2: {exc}"
        ) from None
    if not isinstance(config, dict) or not isinstance(config.get("applications"), list):
        raise ParentProblem(
            "ServeConfigInvalid",
            f"RayService {_name(rayservice)}: serveConfigV2 has no applications list",
        )
    return config


def _serve_deployment(config: Mapping[str, Any], wanted: str | None) -> tuple[int, int]:
    """(application index, deployment index) of the Serve deployment to tune."""
    apps: list[Any] = config["applications"]
    names = [str(a.get("name", "")) for a in apps if isinstance(a, Mapping)]
    app_name, deployment = split_model(wanted) if wanted is not None else (None, None)
    if app_name is None:
        if len(apps) != 1:
            raise ParentProblem(
                "ServeDeploymentAmbiguous",
                f"serveConfigV2 has applications {names}: name one in target.serveDeployment",
            )
        app_index = 0
    else:
        found = [
            i for i, a in enumerate(apps) if isinstance(a, Mapping) and a.get("name") == app_name
        ]
        if not found:
            raise ParentProblem(
                "ServeDeploymentNotFound",
                f"serveConfigV2 has no application {app_name}; it has {names}",
            )
        app_index = found[0]
    deployments = apps[app_index].get("deployments") or []
    listed = [str(d.get("name", "")) for d in deployments]
    if deployment is None:
        if len(deployments) != 1:
            raise ParentProblem(
                "ServeDeploymentAmbiguous",
                f"application {names[app_index]} of serveConfigV2 lists deployments {listed}: "
                "name one as APP/DEPLOYMENT in target.serveDeployment",
            )
        return app_index, 0
    if deployment not in listed:
        raise ParentProblem(
            "ServeDeploymentNotFound",
            f"application {names[app_index]} of serveConfigV2 lists no deployment "
            f"{deployment}; it lists {listed}",
        )
    return app_index, listed.index(deployment)


def user_config_of(rayservice: Mapping[str, Any], target: TargetRef) -> dict[str, Any]:
    """The user_config of the tuned Serve deployment as written in serveConfigV2."""
    config = serve_config(rayservice)
    app, deployment = _serve_deployment(config, target.serve_deployment)
    user = config["applications"][app]["deployments"][deployment].get("user_config")
    return dict(user) if isinstance(user, Mapping) else {}


def user_config_values(params: Mapping[str, float | int]) -> dict[str, Any]:
    """Parameters in Ray Serve's names and units: the wait in seconds; extra
    parameters under their own names."""
    values: dict[str, Any] = {}
    for name, value in params.items():
        if name == MAX_BATCH_SIZE:
            values[BATCH_KEY] = int(value)
        elif name == MAX_QUEUE_TIME_MS:
            values[WAIT_KEY] = float(value) / 1000.0
        else:
            values[name] = value
    return values


def params_of_user_config(user: Mapping[str, Any], names: Sequence[str]) -> Params:
    """The parameters a user_config holds; {} when a batching knob is missing."""
    if BATCH_KEY not in user or WAIT_KEY not in user:
        return {}
    params: Params = {
        MAX_BATCH_SIZE: int(user[BATCH_KEY]),
        MAX_QUEUE_TIME_MS: float(user[WAIT_KEY]) * 1000.0,
    }
    for name in names:
        value = user.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            params[name] = value
    return params


def ray_keys(spec: InferenceServiceSpec) -> list[str]:
    return [BATCH_KEY, WAIT_KEY, *(p.name for p in spec.parameters.extra)]


def ray_original(
    rayservice: Mapping[str, Any], spec: InferenceServiceSpec, now: datetime
) -> OriginalConfig:
    """The knobs as serveConfigV2 holds them. `env` keeps the user_config entries the
    operator may write, JSON-encoded (null: absent), so a restore puts back exactly
    what was there."""
    user = user_config_of(rayservice, spec.target)
    kept = {k: json.dumps(user[k]) if k in user else None for k in ray_keys(spec)}
    params = params_of_user_config(user, [p.name for p in spec.parameters.extra])
    return OriginalConfig(params=params, env=kept, recorded_at=now)


def ray_restore_values(original: OriginalConfig) -> dict[str, Any]:
    return {k: None if v is None else json.loads(v) for k, v in original.env.items()}


def same_user_config(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal, with floats compared as numbers (0.01 written back may read 0.010)."""
    if a.keys() != b.keys():
        return False
    for key, value in a.items():
        other = b[key]
        if isinstance(value, int | float) and isinstance(other, int | float):
            if not math.isclose(float(value), float(other), rel_tol=1e-9, abs_tol=1e-12):
                return False
        elif value != other:
            return False
    return True


def ray_user_config_patch(
    rayservice: Mapping[str, Any], target: TargetRef, values: Mapping[str, Any]
) -> dict[str, Any] | None:
    """A server-side apply body giving the tuned deployment's user_config these values
    (None removes a key; other keys are kept), or None when it holds them already.
    The serveConfigV2 string is rewritten as YAML: its comments do not survive."""
    config = serve_config(rayservice)
    app, deployment = _serve_deployment(config, target.serve_deployment)
    entry = config["applications"][app]["deployments"][deployment]
    before = dict(entry.get("user_config") or {})
    after = {k: v for k, v in before.items() if k not in values}
    after.update({k: v for k, v in values.items() if v is not None})
    if same_user_config(before, after):
        return None
    if after:
        entry["user_config"] = after
    else:
        entry.pop("user_config", None)
    meta = rayservice.get("metadata", {})
    return {
        "apiVersion": rayservice.get("apiVersion"),
        "kind": rayservice.get("kind"),
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "spec": {"serveConfigV2": yaml.safe_dump(config, sort_keys=False)},
    }
