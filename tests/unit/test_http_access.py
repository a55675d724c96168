"""How a server behind a gateway is reached (`tune --header`, `--ca-bundle`): the
requests' headers and CA bundle, and what tune adds to a 401 or 403. The calls
themselves go through a real gateway in tests/component/test_tune_url_gateway.py."""

from __future__ import annotations

import pytest

from batchpilot.loadgen.protocols import REFERENCE, kserve_v2
from batchpilot.runtimes.http import DIRECT, HttpAccess
from batchpilot.tuner.cli import credentials_hint


def test_direct_access_leaves_the_requests_as_they_are() -> None:
    assert DIRECT.applied_to(REFERENCE) is REFERENCE
    assert DIRECT.tls() is True


def test_the_headers_join_the_requests_own_and_replace_one_of_the_same_name() -> None:
    request = kserve_v2("m", headers={"authorization": "Bearer old", "X-Tenant": "a"})
    access = HttpAccess(headers={"Authorization": "Bearer new"}, ca_file="ca.pem")
    sent = access.applied_to(request)
    assert dict(sent.headers) == {
        "Content-Type": "application/json",
        "X-Tenant": "a",
        "Authorization": "Bearer new",
    }
    assert sent.ca_file == "ca.pem"
    assert sent.path == request.path
    assert sent.body(2) == request.body(2)


def test_a_ca_bundle_that_cannot_be_read_is_refused_by_name(
    tmp_path: pytest.TempPathFactory,
) -> None:
    with pytest.raises(ValueError, match=r"the CA bundle \(file nowhere.pem\) is not usable"):
        HttpAccess(ca_file="nowhere.pem").tls()


@pytest.mark.parametrize(
    ("message", "given", "hint"),
    [
        ("the server refused GET /admin/batching with HTTP 401: no", False, "with --header"),
        ("32 requests failed: HTTP 403: forbidden", False, "with --header"),
        ("the server refused GET /admin/batching with HTTP 401: no", True, "refused the"),
        ("the server refused PUT /admin/batching with HTTP 400: bad", False, ""),
        ("HTTP 4010 is no status", False, ""),
    ],
)
def test_a_refusal_for_credentials_says_how_to_give_them(
    message: str, given: bool, hint: str
) -> None:
    said = credentials_hint(message, headers_given=given)
    assert (hint in said) if hint else said == ""
