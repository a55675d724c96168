"""The operator's API client re-reads a rotated service account token: when its file
changes, and on a 401, after which the request is retried once."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from loopback import serving

from batchpilot.operator.kube import Connection, Kube, KubeError


class TokenServer:
    """Answers 200 to the current token and 401 to any other."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.seen: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        self.seen.append(auth)
        if auth != f"Bearer {self.token}":
            return web.json_response(
                {"reason": "Unauthorized", "message": "Unauthorized"}, status=401
            )
        return web.json_response({"kind": "Namespace"})


@pytest.fixture
async def server() -> AsyncIterator[tuple[TokenServer, str]]:
    tokens = TokenServer("old")
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/default", tokens.handle)
    async with serving(app) as url:
        yield tokens, url


@pytest.fixture
async def from_file(
    server: tuple[TokenServer, str], tmp_path: Path
) -> AsyncIterator[tuple[TokenServer, Path, Kube]]:
    """A client logged in with the service account's token file, which holds "old"."""
    tokens, url = server
    path = tmp_path / "token"
    path.write_text("old")
    kube = Kube(Connection(server=url, token="old", token_path=str(path)), attempts=1)
    try:
        yield tokens, path, kube
    finally:
        await kube.close()


def rotate(path: Path, token: str) -> None:
    """As the kubelet does: a new file moved over the old one."""
    new = path.with_suffix(".new")
    new.write_text(token)
    new.replace(path)


async def test_a_rotated_token_is_read_before_the_next_request(
    from_file: tuple[TokenServer, Path, Kube],
) -> None:
    tokens, path, kube = from_file
    assert await kube.get("/api/v1/namespaces/default") == {"kind": "Namespace"}
    tokens.token = "new"
    rotate(path, "new")
    assert await kube.get("/api/v1/namespaces/default") == {"kind": "Namespace"}
    assert tokens.seen == ["Bearer old", "Bearer new"]


async def test_a_401_re_reads_the_token_and_retries_once(
    from_file: tuple[TokenServer, Path, Kube],
) -> None:
    tokens, path, kube = from_file
    assert await kube.get("/api/v1/namespaces/default") == {"kind": "Namespace"}
    # the token changed in place within the file's timestamp resolution: nothing
    # tells the client before the server refuses the old one
    before = path.stat()
    tokens.token = "new"
    path.write_text("new")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert await kube.get("/api/v1/namespaces/default") == {"kind": "Namespace"}
    assert tokens.seen == ["Bearer old", "Bearer old", "Bearer new"]


async def test_a_401_with_an_unchanged_token_is_an_error(
    from_file: tuple[TokenServer, Path, Kube],
) -> None:
    tokens, _, kube = from_file
    tokens.token = "revoked-for-everyone"
    with pytest.raises(KubeError) as error:
        await kube.get("/api/v1/namespaces/default")
    assert error.value.status == 401
    assert tokens.seen == ["Bearer old"]  # no pointless second try


async def test_a_kubeconfig_token_is_sent_as_it_is(server: tuple[TokenServer, str]) -> None:
    tokens, url = server
    kube = Kube(Connection(server=url, token="old"), attempts=1)
    try:
        assert await kube.get("/api/v1/namespaces/default") == {"kind": "Namespace"}
        assert tokens.seen == ["Bearer old"]
    finally:
        await kube.close()
