"""The pure parts of the Perf Analyzer comparison (benchmarks/perf_analyzer.py and
benchmarks/versus_perf_analyzer.py): the command line, the CSV report read back, the
delayed-request warning, the binary request body and the summary over repeats."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import pytest
from rich.console import Console

import perf_analyzer as pa
import versus_perf_analyzer as vpa
from batchpilot.runtimes.triton.control import TritonCounters

# What Perf Analyzer 2.51 wrote with -f for one request-rate run against the bundled model.
REPORT = (
    "Request Rate,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
    "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
    "p50 latency,p90 latency,p95 latency,p99 latency\n"
    "100,94.6036,146,471,2186,31,517,84,0,3003,4335,6469,10687\n"
)


def test_the_report_is_read_with_latencies_in_ms() -> None:
    rows = pa.parse_csv(REPORT)
    assert len(rows) == 1
    figures = pa.figures(rows[0])
    assert figures["offered_rps"] == 100
    assert figures["throughput_rps"] == pytest.approx(94.6036)
    assert figures["p50_ms"] == pytest.approx(3.003)
    assert figures["p99_ms"] == pytest.approx(10.687)
    assert figures["avg Server Queue ms"] == pytest.approx(2.186)


def test_a_report_of_several_rates_gives_a_row_each() -> None:
    text = REPORT + "200,190.5,150,480,2200,30,520,80,0,3100,4400,6500,12000\n"
    assert [row["Request Rate"] for row in pa.parse_csv(text)] == [100, 200]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "no rows"),
        ("Request Rate,p99 latency\n", "no rows"),
        ("Request Rate,p99 latency\n100,fast\n", "'p99 latency' holds 'fast'"),
        ("Request Rate,p99 latency\n100,1,2\n", "does not match its header"),
    ],
)
def test_an_unreadable_report_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(pa.PerfAnalyzerError, match=says):
        pa.parse_csv(text)


def test_a_report_without_percentiles_names_the_missing_columns() -> None:
    rows = pa.parse_csv("Concurrency,Inferences/Second\n1,50\n")
    with pytest.raises(pa.PerfAnalyzerError, match="lacks Request Rate, p50 latency"):
        pa.figures(rows[0])


def test_the_report_file_must_exist_and_hold_one_rate(tmp_path: Path) -> None:
    report = tmp_path / "report.csv"
    with pytest.raises(pa.PerfAnalyzerError, match="wrote no report"):
        pa.report_figures(report)
    report.write_text(REPORT + REPORT.splitlines()[1] + "\n", encoding="utf-8")
    with pytest.raises(pa.PerfAnalyzerError, match="got 2"):
        pa.report_figures(report)
    report.write_text(REPORT, encoding="utf-8")
    assert pa.report_figures(report)["p90_ms"] == pytest.approx(4.335)


def test_the_delayed_share_is_read_from_the_warning() -> None:
    output = (
        "  [WARNING] Perf Analyzer was not able to keep up with the desired request rate. "
        "7.73% of the requests were delayed. \n  Throughput: 789.9 infer/sec\n"
    )
    assert pa.delayed_percent(output) == pytest.approx(7.73)
    assert pa.delayed_percent("  Throughput: 94.6 infer/sec\n") == 0.0


def test_the_command_line_is_open_loop_poisson_at_the_rate_with_fixed_windows(
    tmp_path: Path,
) -> None:
    args = pa.run_args(
        model="batchpilot",
        url="http://127.0.0.1:8000/",
        rate=150,
        input_name="INPUT0",
        width=256,
        input_file=tmp_path / "in.json",
        csv_file=tmp_path / "out.csv",
        measurement_interval_ms=2000,
    )
    assert args[args.index("-u") + 1] == "127.0.0.1:8000"
    assert args[args.index("-i") + 1] == "http"
    for flag in (
        "--async",
        "--request-rate-range=150",
        "--request-distribution=poisson",
        "--measurement-interval=2000",
        "--percentile=99",
        "--max-trials=3",
        "--input-tensor-format=json",
        "--output-tensor-format=json",
    ):
        assert flag in args
    assert args[args.index("--shape") + 1] == "INPUT0:256"
    assert args[args.index("-f") + 1] == str(tmp_path / "out.csv")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"tensor_format": "protobuf"}, "tensor format"),
        ({"rate": 0}, "rate must be > 0"),
        ({"windows": 2}, "windows >= 3"),
    ],
)
def test_a_bad_command_line_is_refused(
    tmp_path: Path, change: dict[str, object], says: str
) -> None:
    args: dict[str, object] = {
        "model": "m",
        "url": "http://127.0.0.1:1",
        "rate": 10.0,
        "input_name": "INPUT0",
        "width": 4,
        "input_file": tmp_path / "i",
        "csv_file": tmp_path / "c",
        "measurement_interval_ms": 100,
        **change,
    }
    with pytest.raises(ValueError, match=says):
        pa.run_args(**args)  # type: ignore[arg-type]


def test_the_input_data_holds_one_row_of_the_given_values() -> None:
    data = json.loads(pa.input_data("INPUT0", [1.0, 1.0, 1.0]))
    assert data == {"data": [{"INPUT0": {"content": [1.0, 1.0, 1.0], "shape": [3]}}]}


def test_a_missing_install_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(pa.PerfAnalyzerError, match="scripts/perf-analyzer"):
        pa.find_perf_analyzer(tmp_path)


def test_the_install_puts_the_cuda_runtime_first_on_the_library_path(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "perf_analyzer").write_bytes(b"")
    libdir = tmp_path / "lib" / "python3.11" / "site-packages" / "nvidia" / "cuda_runtime" / "lib"
    libdir.mkdir(parents=True)
    found = pa.find_perf_analyzer(tmp_path)
    assert found.environment({"LD_LIBRARY_PATH": "/x"})["LD_LIBRARY_PATH"] == f"{libdir}:/x"
    assert found.environment({})["LD_LIBRARY_PATH"] == str(libdir)


# ---------------------------------------------------------------- our side


def test_the_binary_body_is_a_fixed_length_json_header_then_the_raw_floats() -> None:
    body = vpa.binary_row_body(3)
    header, data = body[: vpa.BINARY_HEADER_BYTES], body[vpa.BINARY_HEADER_BYTES :]
    parsed = json.loads(header)
    assert parsed["inputs"][0]["shape"] == [1, 3]
    assert parsed["inputs"][0]["parameters"] == {"binary_data_size": 12}
    assert all(o["parameters"]["binary_data"] for o in parsed["outputs"])
    assert struct.unpack("<3f", data) == (1.0, 1.0, 1.0)
    protocol = vpa.protocol_for("binary")
    assert protocol.headers["Inference-Header-Content-Length"] == str(vpa.BINARY_HEADER_BYTES)


def test_the_json_protocol_is_the_tuners_own() -> None:
    body = json.loads(vpa.protocol_for("json").body(2))
    assert body["inputs"][0]["shape"] == [1, 2]
    assert body["inputs"][0]["data"] == [1.0, 1.0]


def test_the_summary_gives_medians_spread_and_paired_ratios() -> None:
    def ours(p50: float, p99: float) -> dict[str, float]:
        return {
            "p50_ms": p50,
            "p99_ms": p99,
            "throughput_rps": 100.0,
            "from_send_p50_ms": p50,
            "from_send_p99_ms": p99,
            "max_lag_ms": 1.0,
        }

    def theirs(p50: float, p99: float) -> dict[str, float]:
        return {"p50_ms": p50, "p99_ms": p99, "throughput_rps": 100.0, "delayed_percent": 0.0}

    summary = vpa.summarise(
        100.0,
        [ours(5, 10), ours(6, 12), ours(4, 30)],
        [theirs(5, 10), theirs(5, 11), theirs(5, 20)],
    )
    assert summary["batchpilot"]["p99_ms"]["median"] == 12
    assert summary["batchpilot"]["p99_ms"]["relative_spread"] == pytest.approx(20 / 12)
    assert summary["p99_ratio"]["of_medians"] == pytest.approx(12 / 11)
    assert summary["p99_ratio"]["per_repeat"] == pytest.approx([1.0, 12 / 11, 1.5])
    assert summary["within_10pct"]["p99_ratio"] is True
    assert summary["within_10pct"]["p50_ratio"] is True
    assert vpa.targets({"rates": [summary]})["p50_p99_within_10pct_of_perf_analyzer"] is True
    assert vpa.targets({"skipped": "no"}) == {"p50_p99_within_10pct_of_perf_analyzer": None}


def test_the_server_side_figures_are_means_over_the_run() -> None:
    delta = TritonCounters(success=9, failure=1, inferences=10, executions=4, request_us=50_000)
    served = vpa.server_figures(delta)
    assert served["server_mean_ms"] == pytest.approx(5.0)
    assert served["server_mean_batch"] == pytest.approx(2.5)


def test_the_table_shows_every_rate_side_by_side() -> None:
    ours = {
        "p50_ms": 6.0,
        "p99_ms": 20.0,
        "throughput_rps": 100.0,
        "cpu_us_per_request": 700.0,
        "server_mean_ms": 3.5,
        "from_send_p50_ms": 5.0,
        "from_send_p99_ms": 18.0,
        "max_lag_ms": 9.0,
        "mean_lag_ms": 1.5,
        "loop_delay_p99_ms": 12.0,
    }
    theirs = {
        "p50_ms": 4.0,
        "p99_ms": 16.0,
        "throughput_rps": 95.0,
        "cpu_us_per_request": 350.0,
        "server_mean_ms": 3.0,
        "delayed_percent": 0.0,
    }
    summary = vpa.summarise(100.0, [ours], [theirs])
    report = {
        "versus_perf_analyzer": {"repeats": 1, "request": "a row", "rates": [summary]},
        "targets": vpa.targets({"rates": [summary]}),
    }
    out = io.StringIO()
    vpa.show(report, Console(file=out, width=200))
    shown = out.getvalue()
    assert "6.00 / 4.00" in shown
    assert "1.50" in shown  # the p50 ratio
    assert "loop stalls p99 12.0 ms" in shown
    out = io.StringIO()
    vpa.show({"versus_perf_analyzer": {"skipped": "not installed"}}, Console(file=out, width=200))
    assert "not installed" in out.getvalue()


@pytest.mark.parametrize(
    ("rate", "interval_ms", "min_requests", "window"),
    [
        (400.0, 3000, 2000, 3000),  # 3 windows of 3 s already hold 3,600 requests
        (100.0, 3000, 2000, 6667),  # lengthened: 3 x 6.667 s x 100 req/s ≥ 2,000
        (50.0, 3000, 2000, 13334),
        (50.0, 3000, 0, 3000),  # no minimum: the windows as given
    ],
)
def test_a_window_is_lengthened_until_a_run_holds_the_minimum(
    rate: float, interval_ms: int, min_requests: int, window: int
) -> None:
    assert vpa.window_ms(rate, interval_ms, min_requests) == window
    assert vpa.WINDOWS * window * rate / 1000 >= min_requests


def test_a_window_needs_a_positive_rate() -> None:
    with pytest.raises(ValueError, match="rate must be > 0"):
        vpa.window_ms(0.0, 3000, 2000)
