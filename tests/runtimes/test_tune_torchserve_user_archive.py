"""`batchpilot tune --local --runtime torchserve --model-archive FILE.mar` on a handler
written here, not shipped in `src/`, archived by torch-model-archiver with a
model-config.yaml (batchSize 4, maxBatchDelay 5 ms): its answers say nothing about its
batching and its input is its own (JSON {"values": [...]}), so the requests are the
user's --body-template. Every change is a new version of the archive's files, verified
by TorchServe's management API and that version answering the requests; the user's
archive is never changed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from batchpilot.runtimes.torchserve.process import VENV
from batchpilot.runtimes.venvs import venv_executable

from .support import require_runtime

pytestmark = [pytest.mark.runtimes, pytest.mark.timeout(300)]

MODEL = "summer"
# a class, as most handlers are: TorchServe makes one and calls initialize, then handle
HANDLER = """
import json


def _decoded(request):
    body = request.get("body") or request.get("data")
    return json.loads(body) if isinstance(body, (bytes, bytearray)) else body


class Summer:
    def initialize(self, context):
        self.initialized = True

    def handle(self, data, context):
        return [json.dumps({"sum": sum(_decoded(r)["values"])}) for r in data]
"""


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    """summer.mar, as a user builds it with torch-model-archiver."""
    require_runtime(VENV, "torchserve")
    source = tmp_path / "source"
    source.mkdir()
    (source / "summer_handler.py").write_text(HANDLER, encoding="utf-8")
    (source / "model-config.yaml").write_text("batchSize: 4\nmaxBatchDelay: 5\n", "utf-8")
    subprocess.run(
        [
            str(venv_executable(VENV, "torch-model-archiver", runtime="TorchServe")),
            *("--model-name", MODEL, "--version", "2.0"),
            *("--handler", str(source / "summer_handler.py")),
            *("--config-file", str(source / "model-config.yaml")),
            *("--export-path", str(tmp_path)),
        ],
        check=True,
        timeout=60,
    )
    return tmp_path / f"{MODEL}.mar"


def tune(*args: str, timeout_s: float) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "batchpilot", "tune", "--local", "--runtime", "torchserve", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return done.returncode, done.stdout, done.stderr


def test_a_users_archive_tunes_from_its_own_config(archive: Path, tmp_path: Path) -> None:
    before = archive.read_bytes()
    body = tmp_path / "body.json"
    body.write_text('{"values": [1, 2, {size}]}', encoding="utf-8")
    config = tmp_path / "tune.yaml"
    config.write_text("tuning:\n  confirm: false\n", encoding="utf-8")
    code, out, err = tune(
        *("--model-archive", str(archive), "--body-template", str(body)),
        # the flow is under test, not the handler's speed on a shared machine
        *("--quick", "--trials", "2", "--p99-ms", "500", "--config", str(config), "--json"),
        timeout_s=240,
    )
    assert code == 0, err[-2000:]
    result = json.loads(out)
    trials = result["trials"]
    assert [t["label"] for t in trials] == ["baseline", "rule of thumb"]
    assert all(t["state"] == "Complete" for t in trials), trials
    assert all(t["effective_rps"] > 0 for t in trials), trials
    # the baseline is the archive's model-config.yaml: 4 requests, 5 ms
    baseline = result["baseline"]
    assert (baseline["max_batch_size"], baseline["max_queue_time_ms"]) == (4, 5.0)
    runtime = result["runtime"]
    assert runtime["baseline"] == {"batch_size": 4.0, "max_batch_delay": 5.0}
    # the last trial's values, as TorchServe's management API describes the version
    # serving, which then answered the user's requests
    last = trials[-1]["params"]
    cap, delay = last["max_batch_size"], int(last["max_queue_time_ms"])
    verified = runtime["verified_by"]
    assert verified.startswith("management describe (version ")
    assert f": batchSize {cap}, maxBatchDelay {delay} ms, 1 worker(s) READY)" in verified
    burst = min(max(2 * cap, 8), 64)
    assert verified.endswith(f"; {burst} requests to that version answered 2xx")
    # to keep the winner: the archive's config file, or the values at registration
    recommended = result["recommended"]
    assert runtime["persist_where"].startswith(f"the model-config.yaml of {MODEL}.mar")
    assert runtime["persist_snippet"].startswith(
        f"batchSize: {recommended['max_batch_size']}\n"
        f"maxBatchDelay: {int(recommended['max_queue_time_ms'])}\n"
    )
    assert f"Starting the TorchServe 0.12 (model {MODEL} from {archive}" in err
    assert archive.read_bytes() == before


def test_requests_the_handler_refuses_stop_the_run_with_its_exception(
    archive: Path, tmp_path: Path
) -> None:
    body = tmp_path / "body.json"
    body.write_text('{"value": 1}', encoding="utf-8")
    args = ("--model-archive", str(archive), "--body-template", str(body), "--quick")
    code, _, err = tune(*args, timeout_s=150)
    assert code != 0
    assert (
        f"TorchServe answered HTTP 503 to the --body-template requests for model '{MODEL}' "
        "(Prediction failed); the handler raised KeyError: 'values'; give a request body "
        "your handler accepts with --body-template"
    ) in err
    assert "trial 0" not in err, "no trial starts"
