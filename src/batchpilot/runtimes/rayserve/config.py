"""Ray Serve's documents, as pure functions: the deploy configuration the launcher sends,
the same configuration with a deployment's `user_config` changed, what the Serve REST API
reports about a deployment (its user_config, its status, every replica's state), what
the bundled app's answers show (an extra check in tests), and the RayService snippet
that keeps a winner."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batchpilot.errors import TargetError
from batchpilot.runtimes.base import NativeValues
from batchpilot.runtimes.burst import batch_counts

APP_NAME = "batchpilot"
DEPLOYMENT = "BatchModel"
IMPORT_PATH = "ray_batch_app:app"
BATCH_KEY = "max_batch_size"
WAIT_KEY = "batch_wait_timeout_s"
# The bundled app's answers carry these besides its scores.
RECORD_KEYS = ("batch_size", BATCH_KEY, WAIT_KEY, "pid")


class RayServeError(TargetError):
    """Ray Serve answered something unexpected or runs another configuration than asked."""


def user_config(native: Mapping[str, float]) -> dict[str, int | float]:
    return {BATCH_KEY: int(native[BATCH_KEY]), WAIT_KEY: float(native[WAIT_KEY])}


@dataclass(frozen=True)
class ServeApp:
    """An application the launcher deploys: `import_path` (module:attribute, the module
    on the path Ray's workers import from), its name and the deployment whose
    user_config carries the knobs. The default is the bundled app."""

    import_path: str = IMPORT_PATH
    name: str = APP_NAME
    deployment: str = DEPLOYMENT
    route_prefix: str = "/"

    @property
    def model(self) -> str:
        """The app as `--model` names it: APP/DEPLOYMENT."""
        return f"{self.name}/{self.deployment}"


BUNDLED_APP = ServeApp()


def deploy_config(
    native: Mapping[str, float], *, http_port: int, app: ServeApp = BUNDLED_APP
) -> dict[str, Any]:
    """The Serve deploy configuration of `app`: its proxy on 127.0.0.1 only, one replica,
    the batching knobs in its deployment's user_config."""
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": http_port},
        "applications": [
            {
                "name": app.name,
                "route_prefix": app.route_prefix,
                "import_path": app.import_path,
                "deployments": [
                    {
                        "name": app.deployment,
                        "num_replicas": 1,
                        # Serve's default (5) would cap every batch at 5 requests.
                        "max_ongoing_requests": 1024,
                        "user_config": user_config(native),
                    }
                ],
            }
        ],
    }


def split_model(model: str) -> tuple[str, str | None]:
    """`APP` or `APP/DEPLOYMENT` -> (app, deployment or None)."""
    app, _, deployment = model.partition("/")
    if not app or "/" in deployment:
        raise ValueError(f"a Ray Serve model is APP or APP/DEPLOYMENT, got {model!r}")
    return app, deployment or None


@dataclass(frozen=True)
class DeploymentState:
    """One deployment as the Serve REST API reports it."""

    app: str
    deployment: str
    app_status: str
    status: str
    user_config: dict[str, Any]
    replica_pids: tuple[int, ...]
    replica_states: tuple[str, ...] = ()
    target_replicas: int | None = None

    @property
    def settled(self) -> bool:
        """Serve has rolled the deployment's configuration out: the application runs,
        the deployment is healthy and every replica it wants is RUNNING (a replica
        being reconfigured with a new user_config reports UPDATING)."""
        return (
            self.app_status == "RUNNING"
            and self.status == "HEALTHY"
            and bool(self.replica_states)
            and all(state == "RUNNING" for state in self.replica_states)
            and (self.target_replicas is None or len(self.replica_states) == self.target_replicas)
        )

    def describe(self) -> str:
        states = ", ".join(self.replica_states) or "none"
        return f"application {self.app_status}, deployment {self.status}, replicas [{states}]" + (
            f" of {self.target_replicas} wanted" if self.target_replicas is not None else ""
        )


def _deployment_name(app: Mapping[str, Any], name: str, wanted: str | None) -> str:
    deployments = app.get("deployments") or {}
    if wanted is not None:
        if wanted not in deployments:
            raise RayServeError(
                f"application {name!r} has no deployment {wanted!r}; it has {sorted(deployments)}"
            )
        return wanted
    if len(deployments) != 1:
        raise RayServeError(
            f"application {name!r} has deployments {sorted(deployments)}: name the one to "
            f"tune as {name}/DEPLOYMENT"
        )
    only: str = next(iter(deployments))
    return only


def deployment_state(details: Mapping[str, Any], model: str) -> DeploymentState:
    """The deployment `model` (APP or APP/DEPLOYMENT) in the answer of
    GET /api/serve/applications/."""
    name, wanted = split_model(model)
    apps = details.get("applications") or {}
    app = apps.get(name)
    if not isinstance(app, Mapping):
        raise RayServeError(f"Ray Serve runs no application {name!r}; it runs {sorted(apps)}")
    deployment = _deployment_name(app, name, wanted)
    info = app["deployments"][deployment]
    config = info.get("deployment_config") or {}
    replicas = info.get("replicas") or []
    target = info.get("target_num_replicas")
    return DeploymentState(
        app=name,
        deployment=deployment,
        app_status=str(app.get("status")),
        status=str(info.get("status")),
        user_config=dict(config.get("user_config") or {}),
        replica_pids=tuple(sorted(int(r["pid"]) for r in replicas if r.get("pid") is not None)),
        replica_states=tuple(str(r.get("state")) for r in replicas),
        target_replicas=int(target) if isinstance(target, int) else None,
    )


def route_prefix(details: Mapping[str, Any], app: str) -> str:
    """The HTTP route prefix application `app` is served under, in the answer of
    GET /api/serve/applications/; RayServeError when Serve exposes it over no route."""
    found = (details.get("applications") or {}).get(app)
    prefix = found.get("route_prefix") if isinstance(found, Mapping) else None
    if not isinstance(prefix, str) or not prefix.startswith("/"):
        raise RayServeError(
            f"Ray Serve reports no HTTP route for application {app!r} (route_prefix "
            f"{prefix!r}): it is not served over HTTP, or is still deploying; give it a "
            "route_prefix in its deploy configuration"
        )
    return prefix


def under_prefix(prefix: str, path: str) -> str:
    """`path`, relative to an application's root, under its route `prefix`: '/' under
    '/rank' is '/rank', '/v1/completions' under '/rank' is '/rank/v1/completions'."""
    if prefix == "/":
        return path
    return prefix.rstrip("/") + ("" if path == "/" else path)


def native_of(user: Mapping[str, Any], where: str) -> NativeValues:
    """The two knobs in a user_config; RayServeError names one that is missing."""
    missing = [key for key in (BATCH_KEY, WAIT_KEY) if key not in user]
    if missing:
        raise RayServeError(
            f"{where} has no {' or '.join(missing)} in its user_config ({dict(user)}): its "
            f"reconfigure() must take {BATCH_KEY} and {WAIT_KEY} and pass them to "
            "set_max_batch_size / set_batch_wait_timeout_s of its @serve.batch method"
        )
    return {BATCH_KEY: int(user[BATCH_KEY]), WAIT_KEY: float(user[WAIT_KEY])}


def redeploy_config(
    details: Mapping[str, Any], state: DeploymentState, native: Mapping[str, float]
) -> dict[str, Any]:
    """The deploy configuration that Serve runs now (every application, as deployed) with
    `state`'s deployment given the new knobs in its user_config; other keys of that
    user_config are kept. A PUT of it changes only that user_config, which Serve applies
    to the running replicas by calling their reconfigure()."""
    apps = details.get("applications") or {}
    configs = []
    for name, app in apps.items():
        deployed = app.get("deployed_app_config")
        if not isinstance(deployed, Mapping):
            raise RayServeError(
                f"application {name!r} was not deployed from a config file (Serve reports no "
                "deployed_app_config), so BatchPilot cannot redeploy it with another "
                "user_config: deploy it with `serve deploy` or the REST API"
            )
        configs.append(json.loads(json.dumps(deployed)))
    target = next(c for c in configs if c.get("name") == state.app)
    deployments: list[dict[str, Any]] = target.setdefault("deployments", [])
    entry = next((d for d in deployments if d.get("name") == state.deployment), None)
    if entry is None:
        entry = {"name": state.deployment}
        deployments.append(entry)
    entry["user_config"] = {**(entry.get("user_config") or {}), **user_config(native)}
    document: dict[str, Any] = {"applications": configs}
    for key in ("proxy_location", "http_options", "grpc_options", "logging_config"):
        if details.get(key) is not None:
            document[key] = details[key]
    return document


def same_values(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    return int(a[BATCH_KEY]) == int(b[BATCH_KEY]) and math.isclose(
        float(a[WAIT_KEY]), float(b[WAIT_KEY]), rel_tol=1e-9, abs_tol=1e-12
    )


def batch_sizes(answers: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """Batch size -> batches, from the answers: each request of a batch of n reports n
    (a burst's batches are whole when every request of it is in `answers`)."""
    return batch_counts(int(a["batch_size"]) for a in answers)


def check_answers(answers: Sequence[Mapping[str, Any]], native: Mapping[str, float]) -> list[str]:
    """What is wrong with the bundled app's answers for the `native` values; empty when
    every answer comes from a batcher running them, in a batch within the cap."""
    problems: list[str] = []
    seen = sorted({(int(a[BATCH_KEY]), float(a[WAIT_KEY])) for a in answers})
    if any(not same_values({BATCH_KEY: b, WAIT_KEY: w}, native) for b, w in seen):
        problems.append(
            "the replica's batcher runs "
            + ", ".join(f"{BATCH_KEY}={b} {WAIT_KEY}={w:g}" for b, w in seen)
        )
    largest = max((int(a["batch_size"]) for a in answers), default=0)
    if largest > int(native[BATCH_KEY]):
        problems.append(f"a batch of {largest} requests ran, above the cap {native[BATCH_KEY]}")
    return problems


def service_snippet(
    native: Mapping[str, float], *, app: str = APP_NAME, deployment: str = DEPLOYMENT
) -> str:
    """The part of a RayService's spec.serveConfigV2 (a YAML string) that carries the
    knobs: KubeRay applies a changed user_config to the running replicas in place."""
    values = user_config(native)
    return (
        "applications:\n"
        f"  - name: {app}\n"
        "    deployments:\n"
        f"      - name: {deployment}\n"
        "        user_config:\n"
        f"          {BATCH_KEY}: {values[BATCH_KEY]}\n"
        f"          {WAIT_KEY}: {values[WAIT_KEY]!r}\n"
    )
