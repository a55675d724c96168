"""Streaming OpenAI-style load: what each request of a token-stream run asks for.

Every request of the schedule draws its (prompt tokens, output tokens) from the run's
`TokenLengths` (seeded, `lengths.draw_lengths`) and asks for exactly that many tokens
back: `max_tokens` and `min_tokens` set to the drawn output length with `ignore_eos`
(vLLM's sampling extensions; a server that ignores them may stop early, which the
measured token counts show). `stream_options.include_usage` asks for the usage chunk
that the answer's token count is read from.

The prompt approximates its token count with repeated words: the request's position in
the schedule, then `PROMPT_WORD` until the prompt holds that many words. Most
tokenizers make one token of each " hello", so a prompt of P words is about P tokens
plus the model's own additions (a BOS token, a chat template around chat messages).
The leading position makes every prompt of a run differ from its first token on, so a
server's prefix cache cannot answer one request's prefill from another's."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable
from typing import Annotated

from pydantic import Field

from batchpilot.loadgen.lengths import TokenLengths, draw_lengths
from batchpilot.loadgen.tokens import TokenSla
from batchpilot.models import Frozen

PROMPT_WORD = "hello"


class OpenAIStream(Frozen):
    """A token-stream run's requests (completions, or chat completions with `chat`) and
    the SLA its goodput is judged against. Serialisable: load workers rebuild each
    request's body from it."""

    model: Annotated[str, Field(min_length=1)]
    chat: bool = False
    lengths: TokenLengths
    sla: TokenSla = TokenSla()


# A closed-loop warm-up's requests take their lengths from this many drawn in turn.
WARMUP_LENGTHS = 4096


def stream_bodies(spec: OpenAIStream, seed: int) -> Callable[[], bytes]:
    """Bodies one after the other (a closed-loop warm-up's): each prompt its own, the
    lengths drawn as a run's are."""
    lengths = draw_lengths(spec.lengths, WARMUP_LENGTHS, seed)
    positions = itertools.count()

    def next_body() -> bytes:
        k = next(positions)
        return stream_body(spec, k, *lengths[k % len(lengths)])

    return next_body


def stream_prompt(position: int, prompt_tokens: int) -> str:
    """About `prompt_tokens` tokens of text, starting with the request's position."""
    return str(position) + _words(prompt_tokens - 1)


@functools.lru_cache(maxsize=256)
def _words(count: int) -> str:
    """`count` times " " + PROMPT_WORD: the bulk of a prompt, made once per length."""
    return f" {PROMPT_WORD}" * count


def stream_body(spec: OpenAIStream, position: int, prompt_tokens: int, output_tokens: int) -> bytes:
    """The body of request `position` of the schedule."""
    if prompt_tokens < 1 or output_tokens < 1:
        raise ValueError(
            f"prompt and output tokens must be >= 1, got {prompt_tokens} and {output_tokens}"
        )
    prompt = stream_prompt(position, prompt_tokens)
    body: dict[str, object] = {"model": spec.model}
    if spec.chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(
        max_tokens=output_tokens,
        min_tokens=output_tokens,
        ignore_eos=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    return json.dumps(body).encode()
