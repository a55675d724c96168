"""The Ray Serve adapter's pure parts: knobs in Ray's names and units, the deploy and
redeploy documents, what the Serve REST API and the app's answers say, persistence, and
the launcher's arguments and environment (everything on 127.0.0.1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from loopback import serving

from batchpilot.loadgen.protocols import openai
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import LaunchError, representable
from batchpilot.runtimes.rayserve.adapter import RayServeRuntime, app_body
from batchpilot.runtimes.rayserve.config import (
    RayServeError,
    batch_sizes,
    check_answers,
    deploy_config,
    deployment_state,
    native_of,
    redeploy_config,
    route_prefix,
    service_snippet,
    split_model,
    under_prefix,
)
from batchpilot.runtimes.rayserve.control import RayServeControl
from batchpilot.runtimes.rayserve.process import (
    PORT_NAMES,
    RayServeProcess,
    ray_environment,
    start_args,
)
from batchpilot.runtimes.registry import get_runtime, runtime_names


def details(user: dict[str, Any] | None = None, **app: Any) -> dict[str, Any]:
    """An answer of GET /api/serve/applications/ as Ray Serve 2.60 gives it (trimmed)."""
    user = user if user is not None else {"max_batch_size": 8, "batch_wait_timeout_s": 0.005}
    deployed = deploy_config(user, http_port=8000)["applications"][0]
    deployed["deployments"][0]["user_config"] = dict(user)
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": 8000},
        "grpc_options": {"port": 9000, "grpc_servicer_functions": []},
        "applications": {
            "batchpilot": {
                "name": "batchpilot",
                "route_prefix": app.get("route_prefix", "/"),
                "status": app.get("status", "RUNNING"),
                "deployed_app_config": app.get("deployed", deployed),
                "deployments": {
                    "BatchModel": {
                        "name": "BatchModel",
                        "status": app.get("deployment_status", "HEALTHY"),
                        "deployment_config": {"user_config": user, "max_ongoing_requests": 1024},
                        "replicas": [{"replica_id": "r1", "state": "RUNNING", "pid": 4242}],
                    }
                },
            },
            "other": {
                "name": "other",
                "route_prefix": None,
                "status": "RUNNING",
                "deployed_app_config": {"name": "other", "import_path": "x:app"},
                "deployments": {"A": {"name": "A"}, "B": {"name": "B"}},
            },
        },
    }


def test_ray_is_registered_with_knobs_in_rays_names_and_units() -> None:
    assert "ray" in runtime_names()
    runtime = get_runtime("ray")
    assert isinstance(runtime, RayServeRuntime)
    config = BatchingConfig(max_batch_size=16, max_queue_time_ms=2.5)
    assert runtime.native(config) == {"max_batch_size": 16, "batch_wait_timeout_s": 0.0025}
    assert runtime.canonical({"max_batch_size": 16, "batch_wait_timeout_s": 0.0025}) == config
    assert representable(runtime.knobs, config) == config
    assert runtime.describe_knobs() == (
        "max_batch_size -> max_batch_size (requests), max_queue_time_ms -> batch_wait_timeout_s (s)"
    )
    assert runtime.how_applied == "live"


def test_the_protocol_is_the_bundled_apps_json() -> None:
    protocol = RayServeRuntime().protocol()
    assert protocol.path == "/"
    assert protocol.body(3) == b'{"size": 3}'
    with pytest.raises(ValueError, match="size must be >= 1"):
        app_body(0)


def test_the_deploy_config_keeps_the_proxy_on_loopback_and_batches_uncapped() -> None:
    document = deploy_config({"max_batch_size": 8, "batch_wait_timeout_s": 0.005}, http_port=81)
    assert document["http_options"] == {"host": "127.0.0.1", "port": 81}
    deployment = document["applications"][0]["deployments"][0]
    assert deployment["user_config"] == {"max_batch_size": 8, "batch_wait_timeout_s": 0.005}
    # Serve's default of 5 requests in flight per replica would cap every batch at 5
    assert deployment["max_ongoing_requests"] >= 1024


def test_split_model() -> None:
    assert split_model("batchpilot") == ("batchpilot", None)
    assert split_model("batchpilot/BatchModel") == ("batchpilot", "BatchModel")
    for bad in ("", "/x", "a/b/c"):
        with pytest.raises(ValueError, match="APP or APP/DEPLOYMENT"):
            split_model(bad)


def test_deployment_state_reads_the_rest_api() -> None:
    state = deployment_state(details(), "batchpilot")
    assert state.deployment == "BatchModel"
    assert state.settled
    assert state.replica_pids == (4242,)
    assert native_of(state.user_config, "x") == {"max_batch_size": 8, "batch_wait_timeout_s": 0.005}
    assert not deployment_state(details(status="DEPLOYING"), "batchpilot/BatchModel").settled
    assert not deployment_state(details(deployment_status="UPDATING"), "batchpilot").settled


def with_replicas(document: dict[str, Any], states: list[str], target: int) -> dict[str, Any]:
    info = document["applications"]["batchpilot"]["deployments"]["BatchModel"]
    info["replicas"] = [
        {"replica_id": f"r{i}", "state": state, "pid": 100 + i} for i, state in enumerate(states)
    ]
    info["target_num_replicas"] = target
    return document


def test_a_deployment_is_settled_only_with_every_wanted_replica_running() -> None:
    assert deployment_state(with_replicas(details(), ["RUNNING"] * 2, 2), "batchpilot").settled
    # a replica whose reconfigure() runs with the new user_config reports UPDATING
    updating = deployment_state(with_replicas(details(), ["RUNNING", "UPDATING"], 2), "batchpilot")
    assert not updating.settled
    assert "replicas [RUNNING, UPDATING] of 2 wanted" in updating.describe()
    assert not deployment_state(with_replicas(details(), ["RUNNING"], 2), "batchpilot").settled
    assert not deployment_state(with_replicas(details(), [], 0), "batchpilot").settled


class FakeServe:
    """The Serve REST API of one deployment: a PUT records the new deploy configuration,
    and the replica reports UPDATING for `updating_reads` reads before RUNNING."""

    def __init__(self, updating_reads: int) -> None:
        self.document = details()
        self.updating_reads = updating_reads
        self.reads_since_put = 0
        self.puts: list[dict[str, Any]] = []

    async def get(self, _: web.Request) -> web.Response:
        self.reads_since_put += 1
        rolling = self.puts and self.reads_since_put <= self.updating_reads
        states = ["UPDATING"] if rolling else ["RUNNING"]
        status = "UPDATING" if rolling else "HEALTHY"
        document = with_replicas(json.loads(json.dumps(self.document)), states, 1)
        document["applications"]["batchpilot"]["deployments"]["BatchModel"]["status"] = status
        return web.json_response(document)

    async def put(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.puts.append(body)
        self.reads_since_put = 0
        user = body["applications"][0]["deployments"][0]["user_config"]
        info = self.document["applications"]["batchpilot"]["deployments"]["BatchModel"]
        info["deployment_config"]["user_config"] = user
        return web.Response(status=200)


async def test_a_change_is_verified_by_the_rest_api_alone_after_the_rollout() -> None:
    serve = FakeServe(updating_reads=3)
    app = web.Application()
    app.router.add_get("/api/serve/applications/", serve.get)
    app.router.add_put("/api/serve/applications/", serve.put)
    async with serving(app) as url:
        runtime = RayServeRuntime()
        # the app's own URL is never called: nothing listens there
        control = runtime.control("http://127.0.0.1:9", control_url=url)
        config = BatchingConfig(max_batch_size=16, max_queue_time_ms=20.0)
        await control.apply(config)
        verification = control.last_verification
        assert verification is not None
        assert serve.reads_since_put > serve.updating_reads, "waited out the rollout"
        assert verification.live == config
        assert verification.native == {"max_batch_size": 16, "batch_wait_timeout_s": 0.02}
        assert verification.verified_by == (
            "Serve REST API: user_config read back, deployment HEALTHY, its 1 replica(s) "
            "RUNNING (same replica processes)"
        )
        assert await control.current() == config


async def test_a_rollout_that_never_ends_fails_the_change_saying_where_it_stands() -> None:
    serve = FakeServe(updating_reads=10**6)
    app = web.Application()
    app.router.add_get("/api/serve/applications/", serve.get)
    app.router.add_put("/api/serve/applications/", serve.put)
    async with serving(app) as url:
        control = RayServeControl(
            "http://127.0.0.1:9",
            dashboard_url=url,
            model="batchpilot",
            knobs=RayServeRuntime.knobs,
            protocol=RayServeRuntime().protocol(),
            settle_timeout_s=0.3,
        )
        with pytest.raises(RayServeError, match=r"replicas \[UPDATING\] of 1 wanted"):
            await control.apply(BatchingConfig(max_batch_size=2, max_queue_time_ms=1.0))


def test_the_route_prefix_is_the_one_serve_reports_for_the_app() -> None:
    assert route_prefix(details(route_prefix="/rank"), "batchpilot") == "/rank"
    with pytest.raises(RayServeError, match=r"no HTTP route for application 'other'.*None"):
        route_prefix(details(), "other")
    with pytest.raises(RayServeError, match="'missing'"):
        route_prefix(details(), "missing")


@pytest.mark.parametrize(
    ("prefix", "path", "expected"),
    [
        ("/", "/", "/"),
        ("/", "/v1/completions", "/v1/completions"),
        ("/rank", "/", "/rank"),
        ("/rank", "/v1/completions", "/rank/v1/completions"),
        ("/a/b", "/x", "/a/b/x"),
    ],
)
def test_paths_relative_to_the_app_go_under_its_prefix(
    prefix: str, path: str, expected: str
) -> None:
    assert under_prefix(prefix, path) == expected


async def test_requests_go_to_the_route_prefix_serve_reports() -> None:
    serve = FakeServe(updating_reads=0)
    serve.document["applications"]["batchpilot"]["route_prefix"] = "/rank"
    app = web.Application()
    app.router.add_get("/api/serve/applications/", serve.get)
    async with serving(app) as url:
        control = RayServeRuntime().control("http://127.0.0.1:9", control_url=url)
        protocol = await control.request_protocol()
        assert protocol.path == "/rank"
        assert protocol.body(3) == app_body(3)
        assert control.protocol.path == "/rank", "the burst check sends there too"
        assert (await control.request_protocol()).path == "/rank", "not prefixed twice"
        users = openai("m", max_tokens=4)
        assert (await control.request_protocol(users)).path == "/rank/v1/completions"


def test_deployment_state_says_what_is_missing() -> None:
    with pytest.raises(
        RayServeError, match=r"no application 'nope'; it runs \['batchpilot', 'other'\]"
    ):
        deployment_state(details(), "nope")
    with pytest.raises(RayServeError, match="has no deployment 'C'"):
        deployment_state(details(), "other/C")
    with pytest.raises(RayServeError, match="name the one to tune as other/DEPLOYMENT"):
        deployment_state(details(), "other")
    with pytest.raises(RayServeError, match="no batch_wait_timeout_s in its user_config"):
        native_of({"max_batch_size": 4}, "deployment a/b")


def test_a_redeploy_changes_only_the_deployments_user_config() -> None:
    now = details({"max_batch_size": 8, "batch_wait_timeout_s": 0.005, "model": "m1"})
    state = deployment_state(now, "batchpilot")
    document = redeploy_config(now, state, {"max_batch_size": 32, "batch_wait_timeout_s": 0.02})
    apps = {a["name"]: a for a in document["applications"]}
    assert set(apps) == {"batchpilot", "other"}, "every application is kept"
    assert apps["other"] == {"name": "other", "import_path": "x:app"}
    deployment = apps["batchpilot"]["deployments"][0]
    assert deployment["user_config"] == {
        "max_batch_size": 32,
        "batch_wait_timeout_s": 0.02,
        "model": "m1",
    }
    assert deployment["max_ongoing_requests"] == 1024
    assert document["http_options"] == {"host": "127.0.0.1", "port": 8000}
    # the input is not changed
    assert now["applications"]["batchpilot"]["deployed_app_config"]["deployments"][0][
        "user_config"
    ] == {"max_batch_size": 8, "batch_wait_timeout_s": 0.005, "model": "m1"}


def test_a_redeploy_needs_apps_deployed_from_a_config() -> None:
    now = details(deployed=None)
    with pytest.raises(RayServeError, match="not deployed from a config file"):
        redeploy_config(
            now,
            deployment_state(now, "batchpilot"),
            {"max_batch_size": 2, "batch_wait_timeout_s": 0.0},
        )


def answer(batch: int, cap: int, wait: float) -> dict[str, Any]:
    return {"batch_size": batch, "max_batch_size": cap, "batch_wait_timeout_s": wait, "pid": 1}


def test_answers_prove_a_configuration_by_batcher_values_and_batch_sizes() -> None:
    native = {"max_batch_size": 4, "batch_wait_timeout_s": 0.002}
    good = [answer(4, 4, 0.002)] * 4 + [answer(2, 4, 0.002)] * 2 + [answer(1, 4, 0.002)]
    assert check_answers(good, native) == []
    assert batch_sizes(good) == {1: 1, 2: 1, 4: 1}
    stale = [answer(8, 8, 0.005)] * 8
    problems = check_answers(stale, native)
    assert problems == [
        "the replica's batcher runs max_batch_size=8 batch_wait_timeout_s=0.005",
        "a batch of 8 requests ran, above the cap 4",
    ]
    assert check_answers([answer(1, 4, 0.0021)], native) != []


def test_persistence_is_the_rayservice_serve_config_snippet() -> None:
    runtime = RayServeRuntime()
    config = BatchingConfig(max_batch_size=16, max_queue_time_ms=10.0)
    persisted = runtime.persistence(config, model=runtime.default_model)
    assert persisted.kind == "recommend"
    assert "spec.serveConfigV2" in persisted.where
    assert persisted.snippet == (
        "applications:\n"
        "  - name: batchpilot\n"
        "    deployments:\n"
        "      - name: BatchModel\n"
        "        user_config:\n"
        "          max_batch_size: 16\n"
        "          batch_wait_timeout_s: 0.01\n"
    )
    assert service_snippet(
        {"max_batch_size": 2, "batch_wait_timeout_s": 0.0}, app="a", deployment="D"
    ).endswith(
        "      - name: D\n        user_config:\n          max_batch_size: 2\n"
        "          batch_wait_timeout_s: 0.0\n"
    )


def test_control_takes_the_dashboard_of_the_urls_host_by_default() -> None:
    runtime = RayServeRuntime()
    control = runtime.control("http://10.0.0.7:8000")
    assert control.dashboard_url == "http://10.0.0.7:8265"
    assert control.model == "batchpilot/BatchModel"
    other = runtime.control("http://h:1", model="app", dashboard_url="http://h:2")
    assert (other.model, other.dashboard_url) == ("app", "http://h:2")
    with pytest.raises(LaunchError, match="APP or APP/DEPLOYMENT"):
        runtime.control("http://h:1", model="a/b/c")


def test_launcher_refuses_a_workload_and_starts_at_the_native_values() -> None:
    runtime = RayServeRuntime()
    with pytest.raises(LaunchError, match="one bundled app"):
        runtime.launcher(BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0), workload="x")
    server = runtime.launcher(BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0))
    assert isinstance(server, RayServeProcess)
    assert server.native == {"max_batch_size": 8, "batch_wait_timeout_s": 0.005}
    with pytest.raises(RuntimeError, match="not been started"):
        _ = server.url


def test_every_address_ray_start_is_given_is_loopback(tmp_path: Path) -> None:
    ports = {name: 40000 + i for i, name in enumerate(PORT_NAMES)}
    args = start_args(Path("/venv/bin/ray"), ports, tmp_path, 2)
    assert args[:4] == ["/venv/bin/ray", "start", "--head", "--block"]
    assert "--node-ip-address=127.0.0.1" in args
    assert "--dashboard-host=127.0.0.1" in args
    assert f"--temp-dir={tmp_path}" in args
    # every port Ray opens besides the workers' is chosen, none left to its defaults
    given = {a.split("=")[1] for a in args if a.split("=")[0].endswith("port")}
    assert given == {str(p) for name, p in ports.items() if name != "http"}


def test_rays_environment_keeps_it_on_loopback_and_to_its_own_path(tmp_path: Path) -> None:
    env = ray_environment(
        {"PATH": "/usr/bin", "PYTHONPATH": "/project/src", "HOME": "/root"},
        app_dir=tmp_path,
        threads=1,
    )
    assert env["PYTHONPATH"] == str(tmp_path)
    # without it `ray start` replaces 127.0.0.1 by the host's own address
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert env["PATH"].endswith(":/usr/bin")
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["HOME"] == "/root"
