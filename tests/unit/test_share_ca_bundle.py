"""A request protocol's CA bundle travels to the load workers as PEM text in the share:
it round-trips, is checked on arrival (bounded size, PEM that parses) with errors that
name the problem and never echo the bundle, and a file too big to send is refused where
it is read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError
from testca import TEST_CA_PEM

from batchpilot.loadgen.arrivals import as_arrival
from batchpilot.loadgen.protocols import MAX_CA_BUNDLE_BYTES, REFERENCE
from batchpilot.loadgen.serve_worker import ShareRequest, validation_problems
from batchpilot.loadgen.workers import ShareSpec, forwarded_protocol
from batchpilot.models import RequestMix


def _spec() -> ShareSpec:
    return ShareSpec(
        urls=["https://127.0.0.1:9"], rate=50.0, duration_s=1.0, mix=RequestMix.default(),
        arrival=as_arrival("constant"), timeout_s=1.0, seed=3,
    )  # fmt: skip


def _arrived(spec: ShareSpec) -> ShareSpec:
    """The spec as a worker parses it from the wire."""
    return ShareSpec.model_validate_json(spec.model_dump_json())


def test_a_ca_file_travels_as_its_pem_text_and_the_worker_verifies_with_it(
    tmp_path: Path,
) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text(TEST_CA_PEM)
    protocol = dataclasses.replace(REFERENCE, ca_file=str(bundle))
    spec = _spec()
    carried = _arrived(spec.model_copy(update=forwarded_protocol(protocol, spec)))
    assert carried.ca_pem == TEST_CA_PEM
    rebuilt = carried.protocol()
    assert rebuilt is not None
    assert rebuilt.ca_file is None  # the worker holds no file of its sender's machine
    assert rebuilt.ca_pem == TEST_CA_PEM
    context = rebuilt.tls()
    assert not isinstance(context, bool)
    assert len(context.get_ca_certs()) == 1
    assert TEST_CA_PEM not in repr(carried)
    assert TEST_CA_PEM not in repr(rebuilt)


def test_without_a_bundle_the_worker_uses_the_system_trust_store() -> None:
    spec = _spec()
    carried = _arrived(spec.model_copy(update=forwarded_protocol(REFERENCE, spec)))
    assert carried.ca_pem is None
    rebuilt = carried.protocol()
    assert rebuilt is not None
    assert rebuilt.tls() is True


@pytest.mark.parametrize(
    ("pem", "says"),
    [
        ("not a certificate", "no PEM certificate block"),
        (
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            "the load's CA bundle (text) is not usable",
        ),
        ("x" * (MAX_CA_BUNDLE_BYTES + 1), f"at most {MAX_CA_BUNDLE_BYTES} are accepted"),
    ],
)
def test_a_bad_bundle_is_refused_on_arrival_without_echoing_it(pem: str, says: str) -> None:
    wire = ShareRequest(spec=_spec(), start_at=1.0).model_dump(by_alias=True)
    wire["spec"]["ca_pem"] = pem
    with pytest.raises(ValidationError) as caught:
        ShareRequest.model_validate(wire)
    problems = validation_problems(caught.value)
    assert problems.startswith("spec.ca_pem: ")
    assert says in problems
    assert pem[:40] not in problems


def test_a_bundle_file_too_big_to_send_is_refused_where_it_is_read(tmp_path: Path) -> None:
    bundle = tmp_path / "huge.pem"
    bundle.write_text(TEST_CA_PEM * (MAX_CA_BUNDLE_BYTES // len(TEST_CA_PEM) + 1))
    protocol = dataclasses.replace(REFERENCE, ca_file=str(bundle))
    with pytest.raises(ValueError, match=rf"\(file {bundle}\) is over {MAX_CA_BUNDLE_BYTES} bytes"):
        forwarded_protocol(protocol, _spec())


def test_a_bundle_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    protocol = dataclasses.replace(REFERENCE, ca_file=str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match=r"missing.pem\) cannot be read"):
        forwarded_protocol(protocol, _spec())
