"""A small JSON client for the API server, authenticated by a client certificate.

The harness needs a handful of raw calls (bind, status patches, deletes with
preconditions) on plain dicts; the generated Kubernetes client's typed models get in
the way of that, so this speaks HTTP directly."""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from .pki import KeyPair

_TIMEOUT_S = 10.0
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Kube:
    def __init__(self, server: str, ca: Path, user: KeyPair, timeout_s: float = _TIMEOUT_S):
        self._server = server.rstrip("/")
        self._context = ssl.create_default_context(cafile=str(ca))
        self._context.load_cert_chain(str(user.cert), str(user.key))
        self._timeout_s = timeout_s

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        url = self._server + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(
                request, timeout=self._timeout_s, context=self._context
            ) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")
            with contextlib.suppress(ValueError):  # not JSON: keep the text
                detail = json.loads(detail).get("message", detail)
            raise ApiError(error.code, detail) from None
        result: dict[str, Any] = json.loads(raw) if raw else {}
        return result

    def get(self, path: str, **query: str) -> dict[str, Any]:
        return self.request("GET", path, query=query or None)

    def post(self, path: str, body: Any) -> dict[str, Any]:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH) -> dict[str, Any]:
        return self.request("PATCH", path, body, content_type=content_type)

    def delete(self, path: str, body: Any = None) -> dict[str, Any]:
        return self.request("DELETE", path, body)
