"""A real Prometheus (the system's `prometheus` binary) that scrapes the pods the node
agent runs, through a file_sd targets file the agent keeps up to date."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from batchpilot.server.process import free_port

from . import procs

_HTTP_TIMEOUT_S = 3.0
_START_TIMEOUT_S = 60.0


@dataclass
class Prometheus:
    url: str
    targets_file: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        procs.stop(self.proc, grace_s=10.0)

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_S) as response:
            body: dict[str, Any] = json.load(response)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


def start_prometheus(workdir: Path) -> Prometheus:
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError(
            "the `prometheus` binary is not on PATH; scripts/system-deps installs it"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    targets = workdir / "pods.json"
    targets.write_text("[]")
    config = {
        # Short intervals: a trial's step window is a few seconds long.
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "pods",
                "scrape_timeout": "1s",
                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
            }
        ],
    }
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    log = workdir / "prometheus.log"
    proc = procs.spawn(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        log=log,
    )
    prometheus = Prometheus(
        url=f"http://127.0.0.1:{port}", targets_file=targets, log=log, proc=proc
    )
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=_HTTP_TIMEOUT_S):
                return prometheus
        except (urllib.error.URLError, OSError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            prometheus.stop()
            raise RuntimeError(f"Prometheus did not start:\n{procs.tail(log)}")
        time.sleep(0.25)
