"""Where load goes: validating target URLs and checking up front that they answer."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping, Sequence

import aiohttp
from yarl import URL

from batchpilot.loadgen.protocols import client_server_name, client_tls, in_force


class UnreachableError(ConnectionError):
    """A target did not answer; the message says which and why."""


def normalise_urls(urls: str | Sequence[str]) -> list[str]:
    """Base URLs without a trailing slash. Raises ValueError for anything that is not an
    absolute http(s) URL with a host."""
    items = [urls] if isinstance(urls, str) else list(urls)
    if not items:
        raise ValueError("no target URL given: expected one or more http(s)://HOST:PORT URLs")
    result: list[str] = []
    for item in items:
        try:
            url = URL(item.strip())
        except (ValueError, TypeError):
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"target URL {item!r} is not valid: expected http(s)://HOST[:PORT]")
        result.append(str(url).rstrip("/"))
    return result


def endpoint_url(base: str, path: str) -> URL:
    """Where requests to `path` on `base` go. A base that already ends with the path (a
    full endpoint URL such as http://HOST:PORT/v1/predict given where the base URL is
    expected) is used as it is rather than getting the path twice."""
    if not path.startswith("/"):
        raise ValueError(f"request path must start with '/', got {path!r}")
    if path != "/" and URL(base).path.rstrip("/").endswith(path.rstrip("/")):
        return URL(base)
    return URL(base + path)


def base_of(url: str, path: str) -> str:
    """The base URL of `url` when it is a full endpoint URL ending with `path`, else
    `url` itself (without a trailing slash): control calls go to the base."""
    trimmed = url.rstrip("/")
    tail = path.rstrip("/")
    if tail and trimmed.endswith(tail) and URL(trimmed).path.endswith(tail):
        return trimmed[: -len(tail)]
    return trimmed


async def check_reachable(
    urls: Sequence[str],
    *,
    timeout_s: float = 3.0,
    tls: ssl.SSLContext | bool | None = None,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Raise UnreachableError unless every base URL answers HTTP at all (any status will
    do: only "nobody is listening" is an error here). https is verified by `tls`, and the
    request carries `headers` (a gateway's credentials: a gateway may count or block what
    comes without), each else as the load's requests will be, by the protocol in force."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(ssl=client_tls() if tls is None else tls)
    server_name = client_server_name()
    if headers is None:
        protocol = in_force()
        headers = {} if protocol is None else protocol.headers
    async with aiohttp.ClientSession(
        timeout=timeout, connector=connector, headers=dict(headers)
    ) as session:
        for url in urls:
            try:
                async with session.get(
                    url + "/", allow_redirects=False, server_hostname=server_name
                ):
                    pass  # an answer is enough; its body (any length) is never read
            except TimeoutError:
                raise UnreachableError(
                    f"cannot reach {url}: no HTTP answer within {timeout_s:g} s"
                ) from None
            except aiohttp.ClientConnectorError as e:
                reason = (
                    "connection refused (nothing listening)"
                    if isinstance(e.os_error, ConnectionRefusedError)
                    else e.os_error.strerror or str(e.os_error)
                )
                raise UnreachableError(f"cannot reach {url}: {reason}") from None
            except (aiohttp.ClientError, OSError) as e:
                raise UnreachableError(f"cannot reach {url}: {e or type(e).__name__}") from None
            await asyncio.sleep(0)
