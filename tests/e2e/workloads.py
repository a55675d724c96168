"""Manifests the tests apply: the reference server as a Deployment, and an
InferenceService that tunes it with short windows so that a study takes seconds."""

from __future__ import annotations

from typing import Any

import yaml

SERVER_PORT = 8080
# The steps' minimum measured requests. The default (2,000) stretches a 1 s step up to
# 6 s at the few hundred req/s a pod serves here; the scenarios test what the operator
# does with the steps' outcomes, and at the 250 ms SLA a p99 over 200 requests decides
# them as well (a step still short is judged on the p99's upper bound).
E2E_MIN_REQUESTS = 200


def server_deployment(
    name: str,
    *,
    replicas: int = 1,
    max_batch_size: int = 4,
    max_queue_time_ms: float = 2.0,
    command: list[str] | None = None,
) -> dict[str, Any]:
    """The reference server as a user would deploy it: knobs in the environment,
    readiness on /readyz, listening on every address of the pod."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "server",
                            "image": "batchpilot:dev",
                            "command": command
                            or [
                                "batchpilot",
                                "serve",
                                "--host",
                                "0.0.0.0",
                                "--threads",
                                "1",
                                "--drain-timeout-s",
                                "2",
                                "--log-level",
                                "warning",
                            ],
                            "env": [
                                {"name": "PORT", "value": str(SERVER_PORT)},
                                {"name": "MAX_BATCH_SIZE", "value": str(max_batch_size)},
                                {"name": "MAX_QUEUE_TIME_MS", "value": f"{max_queue_time_ms:g}"},
                            ],
                            "ports": [{"name": "http", "containerPort": SERVER_PORT}],
                            "readinessProbe": {
                                "httpGet": {"path": "/readyz", "port": "http"},
                                "periodSeconds": 1,
                            },
                        }
                    ],
                },
            },
        },
    }


def dump(*documents: dict[str, Any]) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False)


def inference_service(
    name: str,
    target: str,
    *,
    strategy: str = "InPlace",
    method: str = "Env",
    max_trials: int = 3,
    write_back: str = "Apply",
    deadline_s: int = 120,
    max_failures: int = 3,
    batch_range: tuple[int, int] = (1, 16),
    finalists: int = 0,
    verify_s: int = 3,
    max_rps: float | None = 100_000.0,
) -> dict[str, Any]:
    """An InferenceService tuned for test speed: one-second steps, coarse precision and
    a handful of trials over a small search space. No confirmation phase by default
    (`finalists` 0): the scenarios about rollouts, write-back and faults need the
    study's best written back (and `minGainPercent` 0: without a confirmation the gain
    gate judges the study's own figures); test_verdict covers the confirmation. `max_rps` is the
    load budget per pod, which strategy InPlace requires (the default caps nothing). A
    write-back is watched for `verify_s` seconds (test_waits covers what a longer watch
    catches)."""
    apply: dict[str, Any] = {"method": method}
    if method == "Live":
        apply["live"] = {"port": SERVER_PORT, "path": "/admin/batching"}
    return {
        "apiVersion": "batchpilot.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "target": {"kind": "Deployment", "name": target, "container": "server"},
            "sla": {"p99LatencyMs": 250, "maxErrorRate": 0.01},
            "parameters": {
                "maxBatchSize": {"min": batch_range[0], "max": batch_range[1]},
                "maxQueueTimeMs": {"min": 0, "max": 10},
            },
            "apply": apply,
            "load": {
                "endpoint": {"port": SERVER_PORT, "path": "/v1/predict"},
                "requests": [{"weight": 8, "size": 1}, {"weight": 2, "size": 8}],
                "stepSeconds": 1,
                "minRequests": E2E_MIN_REQUESTS,
                "warmupSeconds": 0.5,
                "precision": 0.3,
                "requestTimeoutSeconds": 2,
                **({"maxRps": max_rps} if max_rps is not None else {}),
            },
            "tuning": {
                "strategy": strategy,
                "maxTrials": max_trials,
                "sampler": "Random",
                "seed": 7,
                "writeBack": write_back,
                "trialDeadlineSeconds": deadline_s,
                "maxFailures": max_failures,
                "finalists": finalists,
                # without a confirmation the gain gate judges the study's figures: these
                # scenarios are about the write-back, so any best passes it
                **({"minGainPercent": 0} if finalists == 0 else {}),
                "verifySeconds": verify_s,
            },
        },
    }


def container_env(workload: dict[str, Any], container: str = "server") -> dict[str, str]:
    """The literal env values of `container` in a workload's pod template."""
    for c in workload["spec"]["template"]["spec"]["containers"]:
        if c["name"] == container:
            return {e["name"]: e.get("value", "") for e in c.get("env") or []}
    raise LookupError(f"no container {container!r}")


def one_server_deployment(name: str, container: dict[str, Any]) -> dict[str, Any]:
    """A one-replica Deployment of `container` (named "server", the e2e image) as a
    runtime's users deploy it; `container` holds its command, env, ports and probe."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 10,
                    "containers": [{"name": "server", "image": "batchpilot:dev", **container}],
                },
            },
        },
    }


TRITON_HTTP_PORT = 8000
TRITON_METRICS_PORT = 8002
TRITON_MODEL = "batchpilot"


def triton_deployment(
    name: str, *, max_batch_size: int = 4, max_queue_delay_us: int = 2000
) -> dict[str, Any]:
    """Triton with the bundled model as a user would deploy it: the batching knobs in
    the model's configuration (here the serve command's flags), readiness on Triton's
    own endpoint, every listener on the pod's address."""
    command = [
        "python",
        "-m",
        "batchpilot.runtimes.triton.serve",
        "--host=0.0.0.0",
        f"--http-port={TRITON_HTTP_PORT}",
        "--grpc-port=8001",
        f"--metrics-port={TRITON_METRICS_PORT}",
        f"--max-batch-size={max_batch_size}",
        f"--max-queue-delay-us={max_queue_delay_us}",
    ]
    return one_server_deployment(
        name,
        {
            "command": command,
            # the bundled model's matrix product on one BLAS thread
            "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
            "ports": [
                {"name": "http", "containerPort": TRITON_HTTP_PORT},
                {"name": "grpc", "containerPort": 8001},
                {"name": "metrics", "containerPort": TRITON_METRICS_PORT},
            ],
            "readinessProbe": {
                "httpGet": {"path": "/v2/health/ready", "port": "http"},
                "periodSeconds": 1,
            },
        },
    )


def triton_inference_service(name: str, target: str, *, max_trials: int = 3) -> dict[str, Any]:
    """A study of a Triton target through its own API (runtime Triton, method Live):
    no apply.live and no load path, the adapter knows both."""
    isvc = inference_service(name, target, method="Env", max_trials=max_trials)
    spec = isvc["spec"]
    spec["runtime"] = {"kind": "Triton", "model": TRITON_MODEL}
    spec["apply"] = {"method": "Live"}
    spec["load"]["endpoint"] = {"port": TRITON_HTTP_PORT}
    spec["sla"] = {"p99LatencyMs": 500, "maxErrorRate": 0.01}
    return isvc


VLLM_PORT = 8000
VLLM_MODEL = "tiny-llama"


def vllm_deployment(name: str, *, max_num_seqs: int = 4, token_budget: int = 256) -> dict[str, Any]:
    """vLLM's CPU engine as a user would deploy it: the batch cap on the command line
    from a variable (`--max-num-seqs=$(MAX_BATCH_SIZE)`, the way the operator's rollouts
    reach an engine whose knobs are start-up options), readiness on the OpenAI API."""
    command = [
        "python",
        "-m",
        "batchpilot.runtimes.vllm.serve",
        "--host=0.0.0.0",
        f"--port={VLLM_PORT}",
        "--max-num-seqs=$(MAX_BATCH_SIZE)",
        f"--max-num-batched-tokens={token_budget}",
        f"--served-model-name={VLLM_MODEL}",
    ]
    return one_server_deployment(
        name,
        {
            "command": command,
            "env": [{"name": "MAX_BATCH_SIZE", "value": str(max_num_seqs)}],
            "ports": [{"name": "http", "containerPort": VLLM_PORT}],
            "readinessProbe": {
                "httpGet": {"path": "/v1/models", "port": "http"},
                "periodSeconds": 1,
            },
        },
    )


def vllm_inference_service(name: str, target: str) -> dict[str, Any]:
    """A study of a vLLM target by rollout (runtime VLLM, method Env) under TTFT and TPOT
    targets, on streamed completions. The targets are generous: the engine shares two
    cores with the rest of the suite, and the flow is under test. Steps are judged on
    their own streams (`minRequests` 0: a few dozen streams a second never fill the
    whole-request minimum), and the trial deadline holds a pod start of the engine."""
    isvc = inference_service(name, target, max_trials=2, batch_range=(2, 8), deadline_s=600)
    spec = isvc["spec"]
    spec["runtime"] = {"kind": "VLLM", "model": VLLM_MODEL}
    spec["sla"] = {"ttftP99Ms": 3000, "tpotP99Ms": 300, "maxErrorRate": 0.01}
    spec["load"] = {
        "endpoint": {"port": VLLM_PORT},
        "protocol": "OpenAIStream",
        "promptTokens": "fixed:16",
        "outputTokens": "fixed:16",
        "stepSeconds": 2,
        "minRequests": 0,
        "warmupSeconds": 0.5,
        "precision": 0.3,
        "requestTimeoutSeconds": 30,
        "maxRps": 100_000.0,
    }
    return isvc
