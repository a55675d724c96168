"""Triton's batching knobs: the configuration edit, reading knobs back, the counters
from its metrics text, the config.pbtxt snippets and the runtime environment."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

from batchpilot.runtimes.triton.control import (
    TritonCounters,
    TritonError,
    batching_of,
    effective_preferred,
    parse_counters,
    preferred_sizes,
    with_batching,
)
from batchpilot.runtimes.triton.install import RuntimeMissing, TritonInstall, find_install
from batchpilot.runtimes.triton.repository import TritonBatching, batching_pbtxt, model_pbtxt


def triton_config(**dynamic: Any) -> dict[str, Any]:
    return {
        "name": "m",
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "dims": [-1]}],
        "dynamic_batching": {
            "preferred_batch_size": [8],
            "max_queue_delay_microseconds": 5000,
            "preserve_ordering": False,
            **dynamic,
        },
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    }


def test_with_batching_replaces_the_knobs_and_keeps_the_rest() -> None:
    config = triton_config()
    edited = with_batching(config, TritonBatching(16, 250))
    assert edited["max_batch_size"] == 16
    assert edited["dynamic_batching"]["max_queue_delay_microseconds"] == 250
    assert edited["dynamic_batching"]["preserve_ordering"] is False
    assert edited["input"] == config["input"]
    assert edited["instance_group"] == config["instance_group"]
    assert config["max_batch_size"] == 8, "the original is left alone"
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 5000


def preferred_at(original: dict[str, Any], cap: int) -> list[int]:
    preferred: list[int] = with_batching(original, TritonBatching(cap, 0))["dynamic_batching"][
        "preferred_batch_size"
    ]
    return preferred


def test_pinned_preferred_sizes_are_kept_exactly_while_within_the_cap() -> None:
    # the user's model: max_batch_size 16, preferred [8]; caps 8 -> 32 -> 4 -> 64
    users = triton_config(preferred_batch_size=[8]) | {"max_batch_size": 16}
    assert [preferred_at(users, cap) for cap in (8, 32, 4, 64)] == [[8], [8], [], [8]]
    assert [effective_preferred(users, cap) for cap in (8, 32, 4, 64)] == [[8], [8], [4], [8]]
    several = triton_config(preferred_batch_size=[2, 4, 8])
    assert preferred_at(several, 8) == [2, 4, 8]
    assert preferred_at(several, 4) == [], "cleared whole, not cut to [2, 4]"


def test_every_trial_starts_from_the_original_not_the_previous_trial() -> None:
    users = triton_config(preferred_batch_size=[8]) | {"max_batch_size": 16}
    after_cap_4 = with_batching(users, TritonBatching(4, 0))
    assert preferred_at(users, 64) == [8]
    # the same policy on the trial's own configuration would lose the user's [8]
    assert preferred_at(after_cap_4, 64) == []


def test_a_list_of_the_cap_alone_is_triton_filling_in_so_it_follows_the_cap() -> None:
    filled = triton_config(preferred_batch_size=[8])  # max_batch_size 8
    assert preferred_sizes(filled, 32) == []
    assert effective_preferred(filled, 32) == [32]
    assert effective_preferred(filled, 2) == [2]


def test_a_model_without_dynamic_batching_gets_a_block() -> None:
    config = triton_config()
    del config["dynamic_batching"]
    edited = with_batching(config, TritonBatching(4, 100))
    assert edited["dynamic_batching"] == {
        "max_queue_delay_microseconds": 100,
        "preferred_batch_size": [],
    }


def test_batching_of_reads_the_knobs_and_64_bit_strings() -> None:
    assert batching_of(triton_config()) == TritonBatching(8, 5000)
    assert batching_of(triton_config(max_queue_delay_microseconds="1500")) == TritonBatching(
        8, 1500
    )


@pytest.mark.parametrize(
    ("change", "absent"),
    [({"max_batch_size": 0}, "set"), ({"dynamic_batching": None}, "absent")],
)
def test_batching_of_a_model_that_does_not_batch_says_what_to_set(
    change: dict[str, Any], absent: str
) -> None:
    config = {**triton_config(), **change}
    with pytest.raises(TritonError, match=f"does not batch dynamically.*{absent}.*config.pbtxt"):
        batching_of(config)


@pytest.mark.parametrize(
    ("size", "delay", "message"),
    [
        (0, 0, "max_batch_size must be 1-4096"),
        (4097, 0, "max_batch_size must be 1-4096"),
        (4, -1, "max_queue_delay_microseconds must be >= 0"),
    ],
)
def test_triton_batching_refuses_values_out_of_range(size: int, delay: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TritonBatching(size, delay)


METRICS = """\
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1"} 120
nv_inference_request_success{model="m",version="2"} 30
nv_inference_request_success{model="other",version="1"} 999
nv_inference_request_failure{model="m",reason="OTHER",version="1"} 1
nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 2
nv_inference_request_failure{model="m",reason="REJECTED",version="1"} 0
nv_inference_count{model="m",version="1"} 150
nv_inference_exec_count{model="m",version="1"} 25
nv_inference_request_duration_us{model="m",version="1"} 300000
nv_inference_queue_duration_us{model="m",version="1"} 150000
nv_inference_compute_infer_duration_us{model="m",version="1"} 90000
nv_inference_compute_infer_summary_us{model="m",version="1",quantile="0.99"} 4000
nv_inference_pending_request_count{model="m",version="1"} 3
"""


def test_parse_counters_sums_versions_and_reasons_of_one_model() -> None:
    counters = parse_counters(METRICS, "m")
    assert counters == TritonCounters(
        success=150,
        failure=3,
        inferences=150,
        executions=25,
        request_us=300000,
        queue_us=150000,
        compute_us=90000,
    )
    assert counters.mean_batch == 6.0
    assert parse_counters(METRICS, "absent") == TritonCounters()


def test_counter_deltas_give_the_batch_size_and_survive_a_reset() -> None:
    before = TritonCounters(success=100, inferences=100, executions=50, queue_us=1000)
    after = TritonCounters(success=180, inferences=180, executions=60, queue_us=9000)
    delta = after.since(before)
    assert delta.mean_batch == 8.0
    assert delta.mean_queue_ms == pytest.approx(0.1)
    reset = TritonCounters(success=40, inferences=40, executions=5).since(before)
    assert reset.inferences == 40
    assert reset.mean_batch == 8.0
    assert math.isnan(TritonCounters().mean_batch)
    assert math.isnan(TritonCounters().mean_queue_ms)


def test_the_pbtxt_snippet_sets_both_knobs() -> None:
    assert batching_pbtxt(TritonBatching(16, 2500)) == (
        "max_batch_size: 16\n"
        "dynamic_batching {\n"
        "  preferred_batch_size: [ 16 ]\n"
        "  max_queue_delay_microseconds: 2500\n"
        "}\n"
    )
    whole = model_pbtxt(TritonBatching(4, 0), instances=2)
    assert 'backend: "python"' in whole
    assert "allow_ragged_batch: true" in whole
    assert "count: 2" in whole
    assert batching_pbtxt(TritonBatching(4, 0)) in whole
    assert "preferred_batch_size: [ 2, 8 ]" in batching_pbtxt(TritonBatching(16, 0), [2, 8])


def test_the_environment_puts_the_interpreters_own_libpython_and_venv_first(
    tmp_path: Path,
) -> None:
    install = TritonInstall(
        venv=tmp_path / "v", python_version="3.11", python_libdir=Path("/opt/py/lib")
    )
    env = install.environment(
        {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/usr/lib", "PYTHONPATH": "/x"}
    )
    libs = env["LD_LIBRARY_PATH"].split(":")
    assert libs[0] == "/opt/py/lib"
    assert libs[1].endswith("site-packages/nvidia_pytriton.libs")
    assert libs[2] == "/usr/lib"
    assert env["PATH"].split(":") == [str(tmp_path / "v" / "bin"), "/usr/bin"]
    assert "PYTHONPATH" not in env, "the project's modules must not shadow the stub's"
    assert install.stub.parts[-2:] == ("3.11", "triton_python_backend_stub")


async def test_a_missing_environment_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(RuntimeMissing, match=r"not installed: install it with `scripts/runtimes"):
        await find_install(tmp_path / "absent")


async def test_an_incomplete_environment_names_what_is_missing(tmp_path: Path) -> None:
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    # any working interpreter will do: the check asks it for its version and libdir
    (venv / "bin" / "python").symlink_to(sys.executable)
    with pytest.raises(RuntimeMissing, match=r"incomplete \(.*tritonserver.*\)"):
        await find_install(venv)
