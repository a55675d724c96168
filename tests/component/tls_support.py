"""A throw-away certificate authority for the TLS tests (made with the `openssl`
command): a CA, a second CA that signed nothing here, and a server certificate for
127.0.0.1 (or for a DNS name) signed by the first."""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Tls:
    ca: Path
    other_ca: Path
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert, ext = directory / f"{name}.key", directory / f"{name}.crt", directory / "ca.ext"
    ext.write_text(
        "[req]\ndistinguished_name=dn\n[dn]\n[v3]\n"
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
    )
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key))
    _openssl(
        "req", "-x509", "-new", "-key", str(key), "-subj", f"/CN={name}", "-days", "1",
        "-out", str(cert), "-extensions", "v3", "-config", str(ext),
    )  # fmt: skip
    return cert, key


def make_tls(directory: Path, *, server_name: str | None = None) -> Tls:
    """The CAs and a server certificate for 127.0.0.1, or only for the DNS name
    `server_name` when it is given (as a pod's certificate, which rarely names its IP)."""
    san = "IP:127.0.0.1" if server_name is None else f"DNS:{server_name}"
    subject = "127.0.0.1" if server_name is None else server_name
    ca, ca_key = _ca(directory, "test-ca")
    other_ca, _ = _ca(directory, "other-ca")
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.crt"
    ext = directory / "server.ext"
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={san}\n"
    )
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key))
    _openssl("req", "-new", "-key", str(key), "-subj", f"/CN={subject}", "-out", str(csr))
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "1", "-out", str(cert), "-extfile", str(ext),
    )  # fmt: skip
    return Tls(ca=ca, other_ca=other_ca, cert=cert, key=key)


def https_context(tls: Tls) -> ssl.SSLContext:
    """The server side: the certificate the test CA signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    return context
