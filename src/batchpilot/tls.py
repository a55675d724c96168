"""TLS for BatchPilot's HTTP clients: always verified, against the system's trust store
or only the CA certificates a user gives (a private CA in front of a model server or a
Prometheus)."""

from __future__ import annotations

import ssl


class _NotPem(Exception):
    """Text without a certificate block, which OpenSSL would only call empty."""


def verifying_context(
    *, ca_pem: str | None = None, ca_file: str | None = None, what: str = "the CA bundle"
) -> ssl.SSLContext:
    """A verifying client context: the system's trust store, or only the CA certificates
    given (PEM text or a PEM file). Raises ValueError, naming `what`, when they do not
    parse."""
    if ca_pem is not None and ca_file is not None:
        raise ValueError(f"give {what} as PEM text or as a file, not both")
    if ca_pem is None and ca_file is None:
        return ssl.create_default_context()
    problem: str
    try:
        if ca_pem is not None:
            if "-----BEGIN CERTIFICATE-----" not in ca_pem:
                raise _NotPem
            return ssl.create_default_context(cadata=ca_pem)
        return ssl.create_default_context(cafile=ca_file)
    except _NotPem:
        problem = "no PEM certificate block"
    except ssl.SSLError as exc:
        problem = getattr(exc, "reason", None) or str(exc)
    except OSError as exc:
        problem = exc.strerror or str(exc)
    where = f"file {ca_file}" if ca_file is not None else "text"
    raise ValueError(
        f"{what} ({where}) is not usable: {problem}; give one or more "
        "PEM certificates (-----BEGIN CERTIFICATE----- ...)"
    )
