"""A real Prometheus (the `prometheus` binary) on a loopback port, scraping fixed
targets, for tests and local measurements: `async with PrometheusProcess([url]) as p:`."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import aiohttp
import yaml
from yarl import URL

from batchpilot.processes import (
    ChildProcess,
    NotReady,
    free_port,
    read_tail,
    stop_process,
    wait_ready,
)

_POLL_S = 0.2


class PrometheusStartError(RuntimeError):
    """Prometheus did not become ready; the message carries the tail of its log."""


class PrometheusProcess(ChildProcess):
    """Starts Prometheus with a generated config scraping `targets` (base URLs; their
    /metrics) every `scrape_interval_s`, storage in a temporary directory, and stops it
    (SIGTERM, then SIGKILL) on exit. `.url` is its base URL. `relabel_configs` go into
    the scrape job as they are (e.g. a pod's name put in a label of the setup's choice)."""

    def __init__(
        self,
        targets: Sequence[str],
        *,
        scrape_interval_s: float = 1.0,
        job: str = "batchpilot",
        binary: str = "prometheus",
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 10.0,
        relabel_configs: Sequence[Mapping[str, object]] = (),
    ) -> None:
        if not targets:
            raise ValueError("Prometheus needs at least one target to scrape")
        if scrape_interval_s <= 0:
            raise ValueError(f"scrape interval must be > 0 s, got {scrape_interval_s:g}")
        self.targets = [URL(t) for t in targets]
        self.job = job
        self.scrape_interval_s = scrape_interval_s
        self._binary = binary
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._relabel_configs = [dict(r) for r in relabel_configs]
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._process: asyncio.subprocess.Process | None = None
        self.url = ""

    def config(self) -> dict[str, object]:
        interval = f"{round(self.scrape_interval_s * 1000)}ms"
        job: dict[str, object] = {
            "job_name": self.job,
            "scrape_timeout": interval,
            "metrics_path": "/metrics",
            "static_configs": [
                {"targets": [f"{t.host}:{t.explicit_port or t.port}" for t in self.targets]}
            ],
        }
        if self._relabel_configs:
            job["relabel_configs"] = self._relabel_configs
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [job],
        }

    async def start(self) -> None:
        binary = shutil.which(self._binary)
        if binary is None:
            raise PrometheusStartError(
                f"the {self._binary!r} binary is not on PATH (Debian package 'prometheus')"
            )
        self._dir = tempfile.TemporaryDirectory(prefix="batchpilot-prometheus-")
        workdir = Path(self._dir.name)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(self.config()))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = (workdir / "prometheus.log").open("wb")
        try:
            self._process = await asyncio.create_subprocess_exec(
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        finally:
            log.close()
        try:
            await self._wait_ready(workdir / "prometheus.log")
        except BaseException:
            await self.stop()
            raise

    async def wait_for_scrape(self, timeout_s: float = 30.0) -> None:
        """Return once every target has been scraped successfully (`up` is 1)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        query = {"query": f'sum(up{{job="{self.job}"}})'}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3.0)) as session:
            while True:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, KeyError):
                    async with session.get(f"{self.url}/api/v1/query", params=query) as r:
                        result = (await r.json())["data"]["result"]
                        if result and float(result[0]["value"][1]) >= len(self.targets):
                            return
                if loop.time() > deadline:
                    raise PrometheusStartError(
                        f"Prometheus did not scrape {len(self.targets)} target(s) within "
                        f"{timeout_s:g} s"
                    )
                await asyncio.sleep(_POLL_S)

    async def _wait_ready(self, log: Path) -> None:
        assert self._process is not None
        try:
            await wait_ready(
                self._process,
                f"{self.url}/-/ready",
                timeout_s=self._start_timeout_s,
                poll_s=_POLL_S,
            )
        except NotReady:
            tail = await asyncio.to_thread(_log_tail, log)
            raise PrometheusStartError(f"Prometheus did not start on {self.url}:\n{tail}") from None

    async def stop(self) -> None:
        try:
            if self._process is not None:
                await stop_process(self._process, self._stop_timeout_s)
        finally:
            if self._dir is not None:
                self._dir.cleanup()
                self._dir = None


def _log_tail(log: Path, limit: int = 2000) -> str:
    with log.open("rb") as file:
        return read_tail(file, limit)
