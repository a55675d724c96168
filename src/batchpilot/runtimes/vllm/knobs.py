"""vLLM's batching knobs and the command line that sets them. Continuous batching has no
queue-time knob: a request joins the running batch at the next engine step. What bounds a
step is the batch cap (`max_num_seqs`, BatchPilot's max_batch_size: sequences decoded
together) and the token budget (`max_num_batched_tokens`: prefill and decode tokens one
step may compute; with chunked prefill a long prompt is split across steps so decodes
keep their pace)."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import Field, model_validator

from batchpilot.models import BatchingConfig, Frozen

MAX_NUM_SEQS_LIMIT = 4096
# max_num_batched_tokens of vLLM's OpenAI server on a CPU (0.32.0's own default,
# engine/arg_utils.py)
DEFAULT_TOKEN_BUDGET = 2048
MAX_NUM_BATCHED_TOKENS_LIMIT = 1_048_576


class VllmKnobs(Frozen):
    """One configuration of the engine's scheduler. `enable_chunked_prefill` None leaves
    vLLM's own default (on, in the V1 engine)."""

    max_num_seqs: Annotated[int, Field(ge=1, le=MAX_NUM_SEQS_LIMIT)]
    max_num_batched_tokens: Annotated[int, Field(ge=1, le=MAX_NUM_BATCHED_TOKENS_LIMIT)]
    enable_chunked_prefill: bool | None = None

    @model_validator(mode="after")
    def _budget_holds_the_batch(self) -> Self:
        # vLLM refuses to start otherwise: every running sequence decodes one token a step
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs}): each running sequence needs a token "
                "of every step's budget"
            )
        return self

    def label(self) -> str:
        chunked = {None: "", True: " chunked", False: " unchunked"}[self.enable_chunked_prefill]
        return f"seqs={self.max_num_seqs} tokens={self.max_num_batched_tokens}{chunked}"


def vllm_args(knobs: VllmKnobs) -> list[str]:
    """The `vllm serve` / api_server options that set `knobs`."""
    args = [
        "--max-num-seqs",
        str(knobs.max_num_seqs),
        "--max-num-batched-tokens",
        str(knobs.max_num_batched_tokens),
    ]
    if knobs.enable_chunked_prefill is not None:
        args.append(
            "--enable-chunked-prefill"
            if knobs.enable_chunked_prefill
            else "--no-enable-chunked-prefill"
        )
    return args


def knobs_for(config: BatchingConfig, token_budget: int) -> VllmKnobs:
    """BatchPilot's batch cap as vLLM's `max_num_seqs`, with `token_budget` as
    `max_num_batched_tokens`; the queue time has no counterpart (it is pinned)."""
    return VllmKnobs(max_num_seqs=config.max_batch_size, max_num_batched_tokens=token_budget)
