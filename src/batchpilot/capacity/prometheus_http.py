"""Talking to a Prometheus HTTP API safely: the URL checked before use, TLS verified
(against the system's trust store or a given CA bundle), bounded time, few retries, and
error messages that never carry the server's body.

Messages go to Kubernetes Events a tenant can read and to the CLI's one-line errors, so
they name the status and Prometheus's `errorType` only; a short excerpt of the body is
kept apart (`PrometheusQueryError.body_excerpt`) for the operator's own log and the CLI."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import random
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from batchpilot.httpbody import MAX_METRICS_BODY_BYTES, BodyTooLarge, cap_text, read_capped
from batchpilot.retry import backoff_delay, retry
from batchpilot.tls import verifying_context

logger = logging.getLogger(__name__)

BODY_EXCERPT_CHARS = 200
# The most an answer may hold. A step's queries answer a few hundred bytes and the
# configuration a few KiB to a few MiB; a server that streams more (a hostile or broken
# address in a tenant's spec) would otherwise fill the operator's memory, and the
# standby's after it.
MAX_BODY_BYTES = MAX_METRICS_BODY_BYTES
# Prometheus behind a proxy or a rolling restart answers these for a moment
_RETRY_STATUSES = frozenset({502, 503, 504})


# Says why a connection to `host`, which resolved to `addresses` (for an address literal,
# itself), is refused, or None: the operator's URL policy, checked on the addresses each
# connection uses, so that a name re-pointed after the spec was admitted (DNS rebinding)
# is refused too.
AddressGuard = Callable[[str, Sequence[str]], str | None]


class AddressRefused(OSError):
    """The guard refused every address of a host; the message says why."""


class _GuardedResolver(AbstractResolver):
    """aiohttp's default resolver, its answers checked by `guard` before any connection."""

    def __init__(self, guard: AddressGuard) -> None:
        self._guard = guard
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        refusal = self._guard(host, [str(r["host"]) for r in results])
        if refusal is not None:
            raise AddressRefused(refusal)
        return results

    async def close(self) -> None:
        await self._inner.close()


class PrometheusQueryError(RuntimeError):
    """Prometheus did not answer a query; the message says which and why (never with the
    server's body: see `body_excerpt`)."""

    def __init__(self, message: str, *, body_excerpt: str = "") -> None:
        super().__init__(message)
        self.body_excerpt = body_excerpt


class _RetryableStatus(Exception):
    def __init__(self, status: int, reason: str, body: bytes) -> None:
        super().__init__(status)
        self.status, self.reason, self.body = status, reason, body


def check_prometheus_url(url: str) -> str:
    """The base URL without a trailing slash. Raises ValueError, saying what is allowed,
    for anything but an absolute http(s) URL with a host and without a query or fragment:
    API paths are appended to it, and a `?` or `#` would cut them off."""
    text = url.strip()
    if "#" in text:
        raise ValueError(
            f"Prometheus URL {display_url(text)!r} has a fragment ('#'): the API path is "
            "appended to the URL, and a fragment would drop it; give http(s)://HOST[:PORT][/PATH]"
        )
    if "?" in text:
        raise ValueError(
            f"Prometheus URL {display_url(text)!r} has a query ('?'): the API path is "
            "appended to the URL; give http(s)://HOST[:PORT][/PATH]"
        )
    try:
        parsed = URL(text)
    except (ValueError, TypeError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(
            f"Prometheus URL {display_url(text)!r} is not valid: expected "
            "http(s)://HOST[:PORT][/PATH]"
        )
    return text.rstrip("/")


def display_url(url: str) -> str:
    """`url` without user:password, for messages."""
    try:
        parsed = URL(url)
    except (ValueError, TypeError):
        return url
    if parsed.user is None and parsed.password is None:
        return url
    return str(parsed.with_user(None))


def tls_context(*, ca_pem: str | None = None, ca_file: str | None = None) -> ssl.SSLContext:
    """A verifying client context for Prometheus (see `batchpilot.tls.tls_context`)."""
    return verifying_context(ca_pem=ca_pem, ca_file=ca_file, what="the Prometheus CA bundle")


def _excerpt(body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    return text if len(text) <= BODY_EXCERPT_CHARS else text[:BODY_EXCERPT_CHARS] + "…"


def _error_type(body: bytes) -> str | None:
    """Prometheus's `errorType` (a short fixed word such as bad_data), when it sent one."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    kind = data.get("errorType") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) and kind.isidentifier() and len(kind) <= 32 else None


class PrometheusHTTP:
    """GETs of `/api/v1/...` under a base URL, JSON answers. `timeout_s` bounds each call,
    its retries included."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        ca_pem: str | None = None,
        ca_file: str | None = None,
        attempts: int = 3,
        address_guard: AddressGuard | None = None,
    ) -> None:
        self.url = check_prometheus_url(url)
        self._guard = address_guard
        self.shown = display_url(self.url)
        self._timeout_s = timeout_s
        self._attempts = attempts
        # built here, not per call: bad CA input is refused when the source is made
        self._ssl: ssl.SSLContext | None = (
            tls_context(ca_pem=ca_pem, ca_file=ca_file) if self.url.startswith("https") else None
        )
        self._rng = random.Random()

    async def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        """The `data` of Prometheus's answer to GET `path`. Raises PrometheusQueryError."""
        what = path.rsplit("/", 1)[-1]
        try:
            self._check_literal()
            return await asyncio.wait_for(self._get_retried(path, params), self._timeout_s)
        except AddressRefused as exc:
            raise PrometheusQueryError(str(exc)) from None
        except TimeoutError:
            raise PrometheusQueryError(
                f"Prometheus at {self.shown} did not answer within {self._timeout_s:g} s"
            ) from None
        except _RetryableStatus as exc:
            raise self._status_error(what, exc.status, exc.reason, exc.body) from None
        except aiohttp.ClientConnectorCertificateError as exc:
            raise PrometheusQueryError(
                f"Prometheus at {self.shown}: its TLS certificate is not trusted "
                f"({exc.certificate_error}); give the CA that signed it as the CA bundle"
            ) from None
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, AddressRefused):
                raise PrometheusQueryError(str(exc.os_error)) from None
            reason = (
                "connection refused (nothing listening)"
                if isinstance(exc.os_error, ConnectionRefusedError)
                else exc.os_error.strerror or str(exc.os_error)
            )
            raise PrometheusQueryError(f"Prometheus at {self.shown}: {reason}") from None
        except aiohttp.ClientError as exc:
            raise PrometheusQueryError(
                f"Prometheus at {self.shown}: {type(exc).__name__}"
            ) from None

    async def _get_retried(self, path: str, params: dict[str, str] | None) -> Any:
        async def once() -> Any:
            return await self._get_once(path, params)

        return await retry(
            once,
            attempts=self._attempts,
            retryable=lambda e: isinstance(e, _RetryableStatus | aiohttp.ServerDisconnectedError),
            delay=lambda attempt: backoff_delay(attempt, base=0.1, cap=1.0, rng=self._rng),
        )

    def _check_literal(self) -> None:
        """The guard's verdict on a host given as an address, which no resolver sees."""
        host = URL(self.url).host
        if self._guard is None or host is None:
            return
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return  # a name: the resolver checks what it resolves to
        refusal = self._guard(host, [host])
        if refusal is not None:
            raise AddressRefused(refusal)

    async def _get_once(self, path: str, params: dict[str, str] | None) -> Any:
        connector = (
            aiohttp.TCPConnector(resolver=_GuardedResolver(self._guard))
            if self._guard is not None
            else None
        )
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.get(
                f"{self.url}{path}", params=params, ssl=self._ssl or True, allow_redirects=False
            ) as response,
        ):
            body = await self._read_capped(response, path.rsplit("/", 1)[-1])
            if response.status in _RETRY_STATUSES:
                raise _RetryableStatus(response.status, response.reason or "", body)
            if response.status != 200:
                raise self._status_error(
                    path.rsplit("/", 1)[-1], response.status, response.reason or "", body
                )
        try:
            answer = json.loads(body)
            if answer.get("status") != "success":
                raise ValueError
            return answer["data"]
        except (ValueError, AttributeError, KeyError):
            raise PrometheusQueryError(
                f"Prometheus at {self.shown}: the answer to {path.rsplit('/', 1)[-1]} is not "
                "a Prometheus API success",
                body_excerpt=_excerpt(body),
            ) from None

    async def _read_capped(self, response: aiohttp.ClientResponse, what: str) -> bytes:
        """The body, refused (PrometheusQueryError) past MAX_BODY_BYTES: by its declared
        length before a byte is read, else as soon as it streams past the cap."""
        try:
            return await read_capped(response, cap=MAX_BODY_BYTES, url=self.shown)
        except BodyTooLarge:
            raise PrometheusQueryError(
                f"Prometheus at {self.shown} answered {what} with more than "
                f"{cap_text(MAX_BODY_BYTES)}, refused; a Prometheus API answer to these "
                "queries is a few KiB"
            ) from None

    def _status_error(
        self, what: str, status: int, reason: str, body: bytes
    ) -> PrometheusQueryError:
        kind = _error_type(body)
        detail = f", errorType {kind}" if kind else ""
        # the operator's own log may hold the start of the body; Events never do
        logger.info(
            "Prometheus at %s answered %s with HTTP %d: %s",
            self.shown,
            what,
            status,
            _excerpt(body),
        )
        return PrometheusQueryError(
            f"Prometheus at {self.shown} answered {what} with HTTP {status} {reason}".rstrip()
            + detail,
            body_excerpt=_excerpt(body),
        )
