"""Each operator replica names itself in the User-Agent of every request, from its own
API client and from Kopf's, so the API server's audit log tells replicas apart; a
standby answers the liveness probe while it waits for the Lease."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import kopf
import pytest
import yaml
from aiohttp import ClientSession, web
from kopf._cogs.clients.auth import APIContext
from loopback import serving

from batchpilot.operator import handlers
from batchpilot.operator.identity import (
    MAX_IDENTITY,
    package_version,
    replica_identity,
    user_agent,
)
from batchpilot.operator.kopfidentity import identified
from batchpilot.operator.kube import Connection, Kube
from batchpilot.operator.leader import ElectionSettings, Elector
from batchpilot.operator.standby import liveness_address, stand_by, stop_when_deposed
from batchpilot.server.process import free_port


def test_the_user_agent_names_the_product_its_version_and_the_replica() -> None:
    assert user_agent("op-7d9f-1a2b3c4d", "1.2.3") == "batchpilot-operator/1.2.3 (op-7d9f-1a2b3c4d)"
    assert user_agent("op") == f"batchpilot-operator/{package_version()} (op)"


def test_an_identity_is_cut_down_to_what_a_header_comment_may_hold() -> None:
    # parentheses would end the comment early, a backslash escape, a newline the header
    assert user_agent("a(b)c\\d e\nf", "1") == "batchpilot-operator/1 (a_b_c_d_e_f)"
    assert user_agent("x" * 500, "1") == f"batchpilot-operator/1 ({'x' * MAX_IDENTITY})"


@pytest.mark.parametrize("identity", ["", "   ", "()", "\n\t"])
def test_an_identity_with_nothing_printable_is_refused(identity: str) -> None:
    with pytest.raises(ValueError, match="no printable ASCII characters"):
        user_agent(identity, "1")


def test_replica_identities_start_with_the_host_and_differ_per_process() -> None:
    first, second = replica_identity(), replica_identity()
    assert first.startswith(f"{socket.gethostname()}-")
    assert first != second


def test_kopfs_connection_carries_the_user_agent_beside_its_credentials() -> None:
    info = kopf.ConnectionInfo(server="https://127.0.0.1:6443", token="t0k3n")
    headers = identified(info, "batchpilot-operator/1 (a)").as_http_headers()
    assert headers == {"Authorization": "Bearer t0k3n", "User-Agent": "batchpilot-operator/1 (a)"}


async def test_kopfs_session_keeps_the_replicas_user_agent() -> None:
    """Kopf names its session `kopf/<version>` only when the headers name none."""
    info = identified(kopf.ConnectionInfo(server="https://127.0.0.1:6443"), "bp/1 (a)")
    context = APIContext(info)
    try:
        assert context.session.headers["User-Agent"] == "bp/1 (a)"
    finally:
        await context.close()


class Recorder:
    def __init__(self) -> None:
        self.agents: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.agents.append(request.headers.get("User-Agent", ""))
        return web.json_response({"kind": "Namespace"})


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, str]]:
    recorder = Recorder()
    app = web.Application()
    app.router.add_route("*", "/api/v1/namespaces/default", recorder.handle)
    async with serving(app) as url:
        yield recorder, url


@pytest.mark.parametrize("token", ["t0k3n", None])
async def test_the_operators_client_sends_its_user_agent_on_every_request(
    recorder: tuple[Recorder, str], token: str | None
) -> None:
    server, url = recorder
    connection = Connection(server=url, token=token, user_agent="batchpilot-operator/1 (b)")
    kube = Kube(connection, attempts=1)
    try:
        await kube.get("/api/v1/namespaces/default")
        await kube.merge_patch("/api/v1/namespaces/default", {"metadata": {}})
    finally:
        await kube.close()
    assert server.agents == ["batchpilot-operator/1 (b)"] * 2


def test_a_liveness_url_is_read_as_host_port_and_path() -> None:
    assert liveness_address("http://0.0.0.0:8080/healthz") == ("0.0.0.0", 8080, "/healthz")
    assert liveness_address("http://127.0.0.1:81") == ("127.0.0.1", 81, "/")
    with pytest.raises(ValueError, match="needs a host and a port"):
        liveness_address("http://127.0.0.1/healthz")


async def test_a_standby_answers_the_liveness_probe_until_it_leads() -> None:
    """An Elector that cannot reach any API server never leads: the standby waits, its
    probe answers, and cancelling it ends the election and frees the port."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/healthz"
    elector = Elector(ElectionSettings(namespace="ops", identity="a"), lambda: None)
    election = asyncio.create_task(elector.run())
    waiting = asyncio.create_task(stand_by(elector, election, url, report_s=0.05))
    async with ClientSession() as session:
        for _ in range(200):  # bounded: the site starts within the loop's first turns
            try:
                async with session.get(url) as response:
                    assert response.status == 200
                    assert await response.json() == {"standby": True}
                    break
            except OSError:
                await asyncio.sleep(0.01)
        else:
            raise AssertionError("the standby never answered its liveness probe")
    assert not waiting.done()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert election.cancelled()
    with socket.socket() as again:  # Kopf's own probe binds the same port next, so
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp does
        again.bind(("127.0.0.1", port))


class Held:
    """A leadership held until `lose()`."""

    takeover_s = 0.0

    def __init__(self) -> None:
        self._lost = asyncio.Event()

    def lose(self) -> None:
        self._lost.set()

    def is_leader(self) -> bool:
        return not self._lost.is_set()

    async def wait_leader(self, timeout_s: float) -> bool:
        return self.is_leader()

    async def wait_lost(self) -> None:
        await self._lost.wait()


async def test_a_deposed_leader_stops_kopf_and_a_leader_does_not() -> None:
    held, stop = Held(), asyncio.Event()
    watch = asyncio.create_task(stop_when_deposed(held, stop))
    await asyncio.sleep(0)
    assert not stop.is_set()
    held.lose()
    await asyncio.wait_for(watch, timeout=5)
    assert stop.is_set()


def test_logging_in_gives_both_clients_the_replicas_user_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One identity per process, kept across re-logins: Kopf's connection and the
    operator's own carry the same User-Agent."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t0k3n"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setattr(handlers, "CREDENTIALS", handlers._Credentials())
    memo = kopf.Memo(identity="pod-1-abcd")
    info = handlers.log_in(memo, settings=kopf.OperatorSettings(), logger=logging.getLogger())
    agent = user_agent("pod-1-abcd")
    assert info is not None
    assert info.as_http_headers()["User-Agent"] == agent
    assert handlers.CREDENTIALS.connection is not None
    assert handlers.CREDENTIALS.connection.user_agent == agent
    # without an identity from the CLI, one is made once and kept for re-logins
    bare = kopf.Memo()
    first = handlers.log_in(bare, settings=kopf.OperatorSettings(), logger=logging.getLogger())
    again = handlers.log_in(bare, settings=kopf.OperatorSettings(), logger=logging.getLogger())
    assert first is not None
    assert again is not None
    assert first.as_http_headers()["User-Agent"] == again.as_http_headers()["User-Agent"]
    assert first.as_http_headers()["User-Agent"] == user_agent(str(bare["identity"]))
