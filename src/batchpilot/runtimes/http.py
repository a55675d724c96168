"""Calls to a runtime's control endpoints: connection errors, timeouts and 5xx are
retried with exponential backoff and jitter; a 4xx is the server refusing, final. Each
call is bounded in time (`timeout_s`, total) and its answer in size
(MAX_CONTROL_BODY_BYTES: a longer one is refused, final). Every call carries the
headers and verifies https as the server's `HttpAccess` says."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

import aiohttp

from batchpilot.errors import TargetError
from batchpilot.httpbody import MAX_CONTROL_BODY_BYTES, BodyTooLarge, error_message, text_capped
from batchpilot.loadgen.protocols import RequestProtocol, with_headers
from batchpilot.retry import backoff_delay, retry
from batchpilot.tls import verifying_context

log = logging.getLogger(__name__)

# No single wait longer than this, however many attempts are configured.
_BACKOFF_CAP_S = 5.0


class _Retryable(Exception):
    pass


@dataclass(frozen=True)
class HttpAccess:
    """What every call to a server needs besides its URL, the same for its inference and
    its control endpoints (a gateway in front of both): `headers` on each request (a
    bearer token, a tenant header), and https verified against only the CA certificates
    in the PEM file `ca_file` (None: the system's trust store)."""

    headers: Mapping[str, str] = field(default_factory=dict)
    ca_file: str | None = None

    def tls(self) -> ssl.SSLContext | bool:
        """How https is verified (True: the system's trust store). ValueError when the CA
        bundle is not a usable PEM bundle."""
        if self.ca_file is None:
            return True
        return verifying_context(ca_file=self.ca_file, what="the CA bundle")

    def session(self, timeout: aiohttp.ClientTimeout, *, limit: int = 100) -> aiohttp.ClientSession:
        """A client session whose every request carries the headers and verifies https
        as given, with at most `limit` connections."""
        connector = aiohttp.TCPConnector(ssl=self.tls(), limit=limit)
        return aiohttp.ClientSession(
            timeout=timeout, headers=dict(self.headers), connector=connector
        )

    def applied_to(self, protocol: RequestProtocol) -> RequestProtocol:
        """`protocol` with these headers (each over its own of the same name, any case)
        and this CA bundle."""
        protocol = with_headers(protocol, self.headers)
        if self.ca_file is None:
            return protocol
        return dataclasses.replace(protocol, ca_file=self.ca_file)


# a server reached as it is: no extra headers, https against the system's trust store
DIRECT = HttpAccess()


class ClientOptions(TypedDict, total=False):
    """The keywords of `ControlClient` after the URL, for a control that passes them on."""

    timeout_s: float
    attempts: int
    backoff_s: float
    rng: random.Random | None
    access: HttpAccess


class ControlClient:
    """JSON over HTTP to one server's control endpoints (base URL `url`)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        attempts: int = 4,
        backoff_s: float = 0.2,
        rng: random.Random | None = None,
        access: HttpAccess = DIRECT,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.url = url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._rng = rng or random.Random()
        self.access = access

    async def call(
        self, method: str, path: str, body: Any = None, *, empty_ok: bool = False
    ) -> Any:
        """The parsed JSON answer (None for an empty one when `empty_ok`). Raises
        TargetError when the server refuses or cannot be reached after the retries."""

        def logged(attempt: int, error: Exception) -> None:
            log.warning("%s %s failed (attempt %d): %s", method, path, attempt + 1, error)

        try:
            return await retry(
                lambda: self._once(method, path, body, empty_ok),
                attempts=self._attempts,
                retryable=lambda error: isinstance(error, _Retryable),
                delay=lambda attempt: backoff_delay(
                    attempt, base=self._backoff_s, cap=_BACKOFF_CAP_S, rng=self._rng
                ),
                on_error=logged,
            )
        except _Retryable as exc:
            raise TargetError(
                f"{method} {self.url}{path} failed {self._attempts} times: {exc}"
            ) from None

    async def _once(self, method: str, path: str, body: Any, empty_ok: bool) -> Any:
        url = f"{self.url}{path}"
        try:
            async with (
                self.access.session(self._timeout) as session,
                session.request(method, url, json=body) as response,
            ):
                text = await text_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=url)
                if response.status >= 500:
                    raise _Retryable(f"HTTP {response.status}: {text[:200]}")
                if response.status >= 400:
                    raise TargetError(
                        f"the server refused {method} {path} with HTTP {response.status}: "
                        f"{error_message(text)}"
                    )
                if empty_ok and not text.strip():
                    return None
                try:
                    return json.loads(text)
                except ValueError as exc:
                    raise TargetError(
                        f"{method} {path} answered something that is not JSON: {text[:200]}"
                    ) from exc
        except BodyTooLarge as exc:
            # final: the same server would stream the same answer again
            raise TargetError(f"{method} {path}: {exc}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
