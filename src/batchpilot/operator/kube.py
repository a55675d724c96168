"""A small asynchronous Kubernetes API client: the few calls the operator makes, each
with a timeout, and retries with backoff and jitter for conflicts, throttling and
server errors. It uses the credentials Kopf logged in with, so the operator has one
identity (its ServiceAccount) for Kopf's own calls and for these.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from batchpilot.retry import backoff_delay, retry

FIELD_MANAGER = "batchpilot"
RETRIABLE = frozenset({409, 429, 500, 502, 503, 504})
JSON = dict[str, Any]


class KubeError(RuntimeError):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def _retriable(error: Exception) -> bool:
    """Unreachable (status 0), conflicts, throttling and server errors may pass; the rest
    is the API refusing the request."""
    return isinstance(error, KubeError) and (not error.status or error.status in RETRIABLE)


class NotFound(KubeError):
    pass


@dataclass(frozen=True)
class Connection:
    """Where the API server is and how to authenticate (a copy of Kopf's ConnectionInfo)."""

    server: str
    token: str | None = None
    ca_data: bytes | None = None
    ca_path: str | None = None
    insecure: bool = False
    certificate_data: bytes | None = None
    certificate_path: str | None = None
    private_key_data: bytes | None = None
    private_key_path: str | None = None
    username: str | None = None
    password: str | None = None
    # a token that the kubelet rotates (a service account's): re-read when it changes
    token_path: str | None = None
    # tells this replica's requests apart from the others' in the API server's audit log
    user_agent: str | None = None

    @classmethod
    def from_kopf(
        cls, info: Any, *, token_path: str | None = None, user_agent: str | None = None
    ) -> Connection:
        def data(value: str | bytes | None) -> bytes | None:
            if value is None:
                return None
            raw = value.encode() if isinstance(value, str) else value
            # kubeconfig holds base64; a service account's CA file is PEM already
            return raw if raw.lstrip().startswith(b"-----") else base64.b64decode(raw)

        def path(value: Any) -> str | None:
            return None if value is None else str(value)

        return cls(
            server=str(info.server).rstrip("/"),
            token=info.token,
            ca_data=data(info.ca_data),
            ca_path=path(info.ca_path),
            insecure=bool(info.insecure),
            certificate_data=data(info.certificate_data),
            certificate_path=path(info.certificate_path),
            private_key_data=data(info.private_key_data),
            private_key_path=path(info.private_key_path),
            username=info.username,
            password=info.password,
            token_path=token_path,
            user_agent=user_agent,
        )

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https"):
            return False
        context = ssl.create_default_context(
            cafile=self.ca_path, cadata=self.ca_data.decode() if self.ca_data else None
        )
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        cert, key = self.certificate_path, self.private_key_path
        with tempfile.TemporaryDirectory() as tmp:
            # ssl only loads client certificates from files
            if self.certificate_data is not None:
                cert = f"{tmp}/cert.pem"
                with open(cert, "wb") as f:
                    f.write(self.certificate_data)
            if self.private_key_data is not None:
                key = f"{tmp}/key.pem"
                with open(key, "wb") as f:
                    f.write(self.private_key_data)
            if cert is not None:
                context.load_cert_chain(cert, key)
        return context

    def headers(self) -> dict[str, str]:
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if self.username is not None and self.password is not None:
            pair = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            return {"Authorization": f"Basic {pair}"}
        return {}

    def session_headers(self) -> dict[str, str]:
        """The headers every request of a session carries: the user agent, and basic
        auth (a bearer token goes with each request instead, as it may be re-read)."""
        headers = {} if self.token else self.headers()
        if self.user_agent:
            headers["User-Agent"] = self.user_agent
        return headers


class Kube:
    """The API calls of the operator. Create inside a running event loop; close()."""

    def __init__(
        self,
        connection: Connection,
        *,
        timeout_s: float = 30.0,
        attempts: int = 5,
        backoff_base_s: float = 0.5,
        backoff_cap_s: float = 8.0,
        rng: random.Random | None = None,
    ) -> None:
        self._connection = connection
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=min(10.0, timeout_s))
        self._attempts = attempts
        self._base = backoff_base_s
        self._cap = backoff_cap_s
        self._rng = rng or random.Random()
        self._token = connection.token
        self._token_stamp: tuple[int, int, int] | None = None
        self._session = aiohttp.ClientSession(
            headers=connection.session_headers(),
            connector=aiohttp.TCPConnector(ssl=connection.ssl_context(), limit=16),
            timeout=self._timeout,
        )

    async def close(self) -> None:
        await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> JSON:
        url = self._connection.server + path
        if params:
            url += "?" + urlencode(params)
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}

        async def attempts() -> JSON:
            return await retry(
                lambda: self._once(method, url, path, data, headers),
                attempts=self._attempts,
                retryable=_retriable,
                delay=lambda attempt: backoff_delay(
                    attempt, base=self._base, cap=self._cap, rng=self._rng
                ),
            )

        try:
            return await attempts()
        except KubeError as error:
            # a rotated token may be refused before its file's change was seen
            if error.status != 401 or not self._reload_token(force=True):
                raise
        return await attempts()

    def _reload_token(self, *, force: bool = False) -> bool:
        """Re-read the token file when it changed (or, with `force`, anyway); True when
        that gave a new token."""
        path = self._connection.token_path
        if path is None:
            return False
        try:
            st = os.stat(path)  # follows the kubelet's symlink to the current token
        except OSError:
            return False
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._token_stamp and not force:
            return False
        self._token_stamp = stamp
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError:
            return False
        if not token or token == self._token:
            return False
        self._token = token
        return True

    def _auth(self) -> dict[str, str]:
        self._reload_token()
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def _once(
        self, method: str, url: str, path: str, data: str | None, headers: Mapping[str, str]
    ) -> JSON:
        headers = {**headers, **self._auth()}
        try:
            async with self._session.request(method, url, data=data, headers=headers) as r:
                text = await r.text()
                if r.status < 400:
                    result: JSON = json.loads(text) if text else {}
                    return result
                error = _error(r.status, text)
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise KubeError(0, "Unreachable", f"{method} {path}: {exc!r}") from exc
        raise error

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> JSON:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: JSON) -> JSON:
        return await self.request("POST", path, body=body)

    async def delete(self, path: str, *, uid: str | None = None) -> None:
        """Delete, foreground; with `uid`, only that very object (a precondition: one
        recreated under the same name in between is left alone, as 409 Conflict)."""
        body: JSON = {"propagationPolicy": "Foreground"}
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        with contextlib.suppress(NotFound):
            await self.request("DELETE", path, body=body)

    async def merge_patch(self, path: str, body: JSON) -> JSON:
        return await self.request(
            "PATCH", path, body=body, content_type="application/merge-patch+json"
        )

    async def server_side_apply(
        self, path: str, body: JSON, *, force: bool, field_manager: str = FIELD_MANAGER
    ) -> JSON:
        """Server-side apply under `field_manager`. JSON is YAML, so the body goes as
        JSON with the apply-patch content type."""
        params = {"fieldManager": field_manager, "force": "true" if force else "false"}
        return await self.request(
            "PATCH",
            path,
            body=body,
            content_type="application/apply-patch+yaml",
            params=params,
        )


def _error(status: int, text: str) -> KubeError:
    try:
        payload = json.loads(text)
        reason, message = str(payload.get("reason", "")), str(payload.get("message", text))
    except (ValueError, AttributeError):
        reason, message = "", text[:500]
    cls = NotFound if status == 404 else KubeError
    return cls(status, reason or "Error", message)


def field_manager(isvc: str) -> str:
    """The field manager of one InferenceService's applies: with one shared manager,
    an apply by one InferenceService would release the fields another one set."""
    return f"{FIELD_MANAGER}/{isvc}"[:128]


def workload_path(kind: str, namespace: str, name: str = "") -> str:
    plural = {"Deployment": "deployments", "StatefulSet": "statefulsets"}[kind]
    base = f"/apis/apps/v1/namespaces/{quote(namespace)}/{plural}"
    return f"{base}/{quote(name)}" if name else base


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/pods"


def isvc_path(namespace: str, name: str, *, status: bool = False) -> str:
    path = (
        f"/apis/batchpilot.dev/v1alpha1/namespaces/{quote(namespace)}"
        f"/inferenceservices/{quote(name)}"
    )
    return path + "/status" if status else path


def isvcs_path(namespace: str) -> str:
    return f"/apis/batchpilot.dev/v1alpha1/namespaces/{quote(namespace)}/inferenceservices"


def events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/events"
