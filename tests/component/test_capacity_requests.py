"""`batchpilot capacity` sends what `loadtest` can: v2 requests built from a model's
metadata, a body template, and stops before any load, with the server's words and the
flags to give, when the server refuses the first requests. The server is the stub
process serving a v2 model written for the tests (input `x`, FP32 [-1, 3])."""

from __future__ import annotations

import json

import pytest

from support.stub_server import V2_INPUT, V2_WIDTH, StubServerProcess

from .test_loadgen_cli import run_cli

pytestmark = [pytest.mark.component, pytest.mark.timeout(180)]

MODEL = "users-model"
# a server of exactly 150 req/s (the stub's virtual clock): a short search
SEARCH = (
    "--p99-ms", "300", "--step-seconds", "1", "--warmup-seconds", "0", "--start-rps", "60",
    "--arrival", "constant", "--precision", "0.5", "--min-requests", "0", "--json",
)  # fmt: skip


async def test_v2_requests_from_the_models_metadata_are_taken_and_measured() -> None:
    async with StubServerProcess(capacity_rps=150, v2_model=MODEL) as stub:
        code, out, err = await run_cli(
            "capacity", stub.url, "--protocol", "v2", "--model", MODEL, *SEARCH, timeout_s=150
        )
        refused = await stub.served("bad_request")
        served = await stub.served()
    assert code == 0, err
    result = json.loads(out)
    assert result["effective_rps"] > 0
    assert refused == 0
    assert served > 0
    assert all(step["error_rate"] == 0.0 for step in result["steps"] if step["passed"])


async def test_a_body_template_goes_to_the_path_given() -> None:
    row = ", ".join(["0.5"] * V2_WIDTH)
    template = json.dumps(
        {"inputs": [{"name": V2_INPUT, "datatype": "FP32", "shape": [1, V2_WIDTH], "data": []}]}
    ).replace("[]", f"[{row}]")
    async with StubServerProcess(capacity_rps=150, v2_model=MODEL) as stub:
        code, out, err = await run_cli(
            "capacity", stub.url, "--body-template", template,
            "--path", f"/v2/models/{MODEL}/infer", *SEARCH, timeout_s=150,
        )  # fmt: skip
        refused = await stub.served("bad_request")
    assert code == 0, err
    assert json.loads(out)["effective_rps"] > 0
    assert refused == 0


@pytest.mark.parametrize(
    ("args", "flags"),
    [
        (
            ["--path", f"/v2/models/{MODEL}/infer"],
            "--protocol v2 --model M (requests from the model's metadata)",
        ),
        (
            ["--protocol", "v2", "--model", MODEL, "--input-name", "INPUT0"],
            "--input-name and --features (one FP32 tensor) or --body-template",
        ),
    ],
)
async def test_refused_first_requests_stop_before_any_load(args: list[str], flags: str) -> None:
    async with StubServerProcess(capacity_rps=150, v2_model=MODEL) as stub:
        code, out, err = await run_cli("capacity", stub.url, *args, *SEARCH)
        refused = await stub.served("bad_request")
        served = await stub.served()
    assert code != 0
    assert out == ""
    assert "the server refused the first requests" in err
    assert "HTTP 400" in err
    assert flags in err
    assert (refused, served) == (1, 0)  # the first refusal ends it: no step ran
