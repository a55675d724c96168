"""Reading an OpenAI-style token stream (Server-Sent Events) as it arrives: when each
token-bearing chunk came, how many tokens the answer held, and whether the stream was
whole.

The body is fed as the connection receives it (`TokenStream.feed`, with the loop time
of its arrival). An event ends at a blank line; its `data:` lines are one JSON chunk, or
`[DONE]`, which ends the stream. A chunk bears tokens when a choice has non-empty `text`
(completions) or `delta.content` (chat); a `usage` object's `completion_tokens` is the
answer's token count when the server sends one (`stream_options.include_usage`),
otherwise each token-bearing chunk counts as one token. What makes a stream an error is
decided in `TokenStream.problem`, pure and in one place."""

from __future__ import annotations

import json
from typing import Any

# Outcomes of an answered (HTTP 2xx) stream that did not deliver: error kinds of a run.
STREAM_INCOMPLETE = "stream_incomplete"  # ended without `data: [DONE]`
STREAM_ERROR = "stream_error"  # an error event (`event: error` or a chunk with `error`)
STREAM_MALFORMED = "stream_malformed"  # a data line that is not a JSON object
STREAM_EMPTY = "stream_empty"  # [DONE] without a single token
DONE = "[DONE]"


class TokenStream:
    """One response's stream, parsed incrementally. `times` holds the loop time of every
    token-bearing chunk, `usage_tokens` the server's own count (None: none sent)."""

    __slots__ = ("_buffer", "_data", "_event", "done", "error", "times", "usage_tokens")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._event = b""
        self.times: list[float] = []
        self.usage_tokens: int | None = None
        self.done = False
        self.error: str | None = None  # the first problem's kind

    def feed(self, data: bytes, at: float) -> None:
        """Body bytes received at loop time `at`."""
        if self.done or self.error is not None:
            return
        lines = (self._buffer + data).split(b"\n")
        self._buffer = lines.pop()
        for raw in lines:
            line = raw.rstrip(b"\r")
            if not line:
                self._dispatch(at)
            elif line.startswith(b"data:"):
                self._data.append(line[5:].removeprefix(b" "))
            elif line.startswith(b"event:"):
                self._event = line[6:].strip()
            # comments (":") and other fields (id, retry) carry nothing measured
            if self.done or self.error is not None:
                return

    def finish(self, at: float) -> None:
        """The response ended: an event the server left unterminated still counts."""
        if self._buffer.strip():
            self.feed(b"\n\n", at)
        elif self._data:
            self._dispatch(at)

    def tokens(self) -> int:
        """The answer's output tokens: the server's usage count, else the chunks that bore
        tokens."""
        return self.usage_tokens if self.usage_tokens is not None else len(self.times)

    def problem(self) -> str | None:
        """Why the stream is not a whole answer (an error kind), None when it is."""
        if self.error is not None:
            return self.error
        if not self.done:
            return STREAM_INCOMPLETE
        if not self.times:
            return STREAM_EMPTY
        return None

    def _dispatch(self, at: float) -> None:
        data, event = b"\n".join(self._data), self._event
        self._data, self._event = [], b""
        if not data and not event:
            return
        if event == b"error":
            self.error = STREAM_ERROR
            return
        if data.strip() == DONE.encode():
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self.error = STREAM_MALFORMED
            return
        if not isinstance(chunk, dict):
            self.error = STREAM_MALFORMED
        elif chunk.get("error") is not None:
            self.error = STREAM_ERROR
        else:
            self._take(chunk, at)

    def _take(self, chunk: dict[str, Any], at: float) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            count = usage.get("completion_tokens")
            if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
                self.usage_tokens = count
        choices = chunk.get("choices")
        if isinstance(choices, list) and any(_bears_tokens(c) for c in choices):
            self.times.append(at)


def _bears_tokens(choice: object) -> bool:
    if not isinstance(choice, dict):
        return False
    text = choice.get("text")
    if text is None and isinstance(delta := choice.get("delta"), dict):
        text = delta.get("content")
    return isinstance(text, str) and text != ""
