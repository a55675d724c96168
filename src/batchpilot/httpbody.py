"""Reading an HTTP answer from an address someone else chose, with a cap on its size.

A server that streams without end (a hostile or broken address in a tenant's spec, a
wrong port on the command line) would otherwise fill the reader's memory: the
operator's leader, then its standby reading the same spec. Every answer read from such
an address goes through `read_capped`, refused by its declared Content-Length before a
byte is read, else as soon as the streamed body passes the cap. The time cap is the
caller's: every such session has a total timeout."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

# A control or admin endpoint's answer (a configuration, a model's metadata, a batch
# record) is a few KiB; 4 MiB leaves room for a large one.
MAX_CONTROL_BODY_BYTES = 4 * 1024 * 1024
# A metrics exposition or a Prometheus API answer can be larger (many series).
MAX_METRICS_BODY_BYTES = 16 * 1024 * 1024
_CHUNK_BYTES = 64 * 1024


class BodyTooLarge(ValueError):
    """An answer longer than the cap was refused; the message says from where and the cap."""

    def __init__(self, url: str, cap: int, *, declared: int | None = None) -> None:
        size = f"declares {declared} bytes" if declared is not None else "streamed past it"
        super().__init__(
            f"the answer from {url} was refused: it is larger than the cap of "
            f"{cap_text(cap)} ({size})"
        )
        self.url, self.cap, self.declared = url, cap, declared


def cap_text(cap: int) -> str:
    """`cap` bytes in words: '4 MiB', '512 KiB' or '100 bytes'."""
    for unit, size in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if cap >= size and cap % size == 0:
            return f"{cap // size} {unit}"
    return f"{cap} bytes"


async def read_capped(response: aiohttp.ClientResponse, *, cap: int, url: str = "") -> bytes:
    """The body of `response`, at most `cap` bytes; BodyTooLarge (naming `url`, by default
    the response's own) for a longer one."""
    where = url or str(response.url)
    declared = response.content_length
    if declared is not None and declared > cap:
        raise BodyTooLarge(where, cap, declared=declared)
    body = bytearray()
    async for chunk in response.content.iter_chunked(_CHUNK_BYTES):
        body += chunk
        if len(body) > cap:
            raise BodyTooLarge(where, cap)
    return bytes(body)


async def text_capped(response: aiohttp.ClientResponse, *, cap: int, url: str = "") -> str:
    """`read_capped`, decoded by the answer's charset (UTF-8 when it names none or an
    unknown one), undecodable bytes replaced."""
    body = await read_capped(response, cap=cap, url=url)
    charset = response.charset or "utf-8"
    try:
        return body.decode(charset, errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")


async def json_capped(response: aiohttp.ClientResponse, *, cap: int, url: str = "") -> Any:
    """`read_capped`, parsed as JSON whatever its content type (json.JSONDecodeError, a
    ValueError, when it is not JSON)."""
    return json.loads(await read_capped(response, cap=cap, url=url))


def error_message(text: str) -> str:
    """The server's error message when it sent JSON {"error": ...} (or "detail"), else
    the text."""
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(data, dict):
        for key in ("error", "detail"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return text[:300]
