"""PyTorch is the `server` extra: the operator, the load generator (with its worker
processes), the capacity search and the simulator run where it is not installed, and the
commands that need it say which extra brings it.

Each command runs in a subprocess whose interpreter cannot import `torch`: a
sitecustomize on PYTHONPATH puts a finder in front of the others that refuses it. (Setting
`sys.modules["torch"] = None` instead would not do: SciPy looks torch up in sys.modules and
breaks on the None.)"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

import batchpilot
from support.stub_server import StubServerProcess

pytestmark = [pytest.mark.component, pytest.mark.timeout(240)]

SRC = Path(batchpilot.__file__).resolve().parent.parent

NO_TORCH = """
import sys


class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoTorch())
"""


@pytest.fixture(scope="module")
def no_torch_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("no-torch")
    (site / "sitecustomize.py").write_text(NO_TORCH)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(SRC)])
    env["MPLCONFIGDIR"] = str(site / "matplotlib")
    return env


async def run(env: dict[str, str], *args: str, timeout_s: float = 120.0) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_guard_really_hides_torch(no_torch_env: dict[str, str]) -> None:
    code, _, err = await run(no_torch_env, "-c", "import torch")
    assert code != 0
    assert "No module named 'torch'" in err


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("operator", "--all-namespaces"),
        ("capacity", "--p99-ms"),
        ("loadtest", "--rate"),
        ("simulate", "--cost-model"),
        ("tune", "--simulator"),
    ],
)
async def test_help_of_each_command_without_torch(
    no_torch_env: dict[str, str], command: str, says: str
) -> None:
    code, out, err = await run(no_torch_env, "-m", "batchpilot", command, "--help")
    assert code == 0, err
    assert says in out


async def test_operator_modules_import_without_torch(no_torch_env: dict[str, str]) -> None:
    modules = [
        "batchpilot.operator.handlers",
        "batchpilot.operator.world",
        "batchpilot.operator.study",
        "batchpilot.capacity.prometheus",
        "batchpilot.loadgen.workers",
        "batchpilot.runtimes.reference",
    ]
    code, out, err = await run(
        no_torch_env,
        "-c",
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print('torch' in sys.modules)",
    )
    assert code == 0, err
    assert out.strip() == "False"


async def test_simulate_and_tune_simulator_run_without_torch(
    no_torch_env: dict[str, str], tmp_path: Path
) -> None:
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"kind": "linear", "fixed_ms": 1.85, "per_row_ms": 0.28}))
    code, out, err = await run(
        no_torch_env, "-m", "batchpilot", "simulate", "--p99-ms", "100",
        "--max-batch-size", "8", "--max-queue-time-ms", "5", "--cost-model", str(cost), "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["effective_rps"] > 0
    code, out, err = await run(
        no_torch_env, "-m", "batchpilot", "tune", "--simulator", str(cost), "--p99-ms", "100",
        "--max-trials", "4", "--seed", "1", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert len(json.loads(out.strip().splitlines()[-1])["trials"]) == 4


GP_SPEC = """
from pydantic import ValidationError
from batchpilot.operator.spec import parse_spec

spec = {"target": {"name": "resnet", "container": "server"}, "sla": {"p99LatencyMs": 300},
        "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}}, "tuning": {"sampler": "GP"}}
try:
    parse_spec(spec)
except ValidationError as error:
    print(error.errors()[0]["msg"])
else:
    print("accepted")
"""


async def test_the_gp_sampler_is_refused_up_front_where_it_cannot_run(
    no_torch_env: dict[str, str], tmp_path: Path
) -> None:
    # the operator refuses the spec (SpecValid False) instead of failing trials later
    code, out, err = await run(no_torch_env, "-c", GP_SPEC)
    assert code == 0, err
    assert "sampler GP (Optuna's GPSampler) needs PyTorch" in out
    assert "choose TPE (the default) or Random" in out
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"kind": "linear", "fixed_ms": 1.85, "per_row_ms": 0.28}))
    code, _, err = await run(
        no_torch_env, "-m", "batchpilot", "tune", "--simulator", str(cost), "--sampler", "GP",
    )  # fmt: skip
    assert code == 2
    assert "sampler GP (Optuna's GPSampler) needs PyTorch" in err


async def test_load_workers_and_capacity_run_without_torch(no_torch_env: dict[str, str]) -> None:
    async with StubServerProcess(capacity_rps=400) as stub:
        code, out, err = await run(
            no_torch_env, "-m", "batchpilot", "capacity", stub.url, "--p99-ms", "200",
            "--workers", "2", "--json",
            # short steps: what is under test is that the search runs, not its figure
            "--step-seconds", "1", "--warmup-seconds", "0.5", "--min-requests", "100",
            "--precision", "0.2",
        )  # fmt: skip
        assert code == 0, err
        assert json.loads(out)["effective_rps"] > 0
        code, out, err = await run(
            no_torch_env, "-m", "batchpilot", "loadtest", stub.url, "--rate", "40",
            "--duration", "1", "--arrival", "constant", "--json",
        )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["ok"] == 40


async def test_serve_names_the_extra(no_torch_env: dict[str, str]) -> None:
    code, _, err = await run(no_torch_env, "-m", "batchpilot", "serve", "--port", "1")
    assert code == 1
    assert err.strip().splitlines() == [
        "Error: batchpilot serve (the reference server) needs PyTorch, which is not installed "
        "here; it comes with the `server` extra: pip install 'batchpilot[server]'"
    ]


async def test_tune_local_of_the_reference_server_names_the_extra(
    no_torch_env: dict[str, str],
) -> None:
    code, _, err = await run(
        no_torch_env, "-m", "batchpilot", "tune", "--local", "--quick", "--trials", "1"
    )
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("Error: the reference server did not start: ")
    assert "pip install 'batchpilot[server]'" in last
