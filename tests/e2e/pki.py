"""Certificates and keys for a throw-away control plane, made with the `openssl` command
(no Python crypto dependency): a CA, the API server's serving certificate, client
certificates, and the service-account signing key."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_OPENSSL_TIMEOUT_S = 30
_DAYS = "2"  # the cluster lives for one test session


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: KeyPair
    apiserver: KeyPair
    admin: KeyPair
    controller_manager: KeyPair
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str) -> None:
    result = subprocess.run(
        ["openssl", *args], capture_output=True, timeout=_OPENSSL_TIMEOUT_S, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.decode(errors='replace')}")


def _ec_key(path: Path) -> None:
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)
    )


def _issue(
    directory: Path, name: str, subject: str, extensions: str, ca: KeyPair | None
) -> KeyPair:
    key = directory / f"{name}.key"
    cert = directory / f"{name}.crt"
    ext = directory / f"{name}.ext"
    _ec_key(key)
    ext.write_text(extensions)
    if ca is None:
        _openssl(
            "req", "-x509", "-new", "-key", str(key), "-subj", subject, "-days", _DAYS,
            "-out", str(cert), "-extensions", "v3", "-config", str(ext),
        )  # fmt: skip
    else:
        csr = directory / f"{name}.csr"
        _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
            "-CAcreateserial", "-days", _DAYS, "-out", str(cert), "-extfile", str(ext),
        )  # fmt: skip
    return KeyPair(cert=cert, key=key)


def _client(directory: Path, name: str, subject: str, ca: KeyPair) -> KeyPair:
    return _issue(
        directory,
        name,
        subject,
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=clientAuth\n",
        ca,
    )


def make_pki(directory: Path, server_ips: list[str]) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _issue(
        directory,
        "ca",
        "/CN=batchpilot-e2e-ca",
        "[req]\ndistinguished_name=dn\n[dn]\n[v3]\n"
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n",
        None,
    )
    sans = ",".join(
        [f"IP:{ip}" for ip in server_ips]
        + [
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
        ]
    )
    apiserver = _issue(
        directory,
        "apiserver",
        "/CN=kube-apiserver",
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n",
        ca,
    )
    # system:masters bypasses RBAC: only the harness (the "kubelet", kubectl as the
    # cluster admin) uses it; the operator gets a ServiceAccount token.
    admin = _client(directory, "admin", "/O=system:masters/CN=batchpilot-e2e-admin", ca)
    controller_manager = _client(
        directory, "controller-manager", "/CN=system:kube-controller-manager", ca
    )
    sa_key = directory / "sa.key"
    sa_pub = directory / "sa.pub"
    _ec_key(sa_key)
    _openssl("pkey", "-in", str(sa_key), "-pubout", "-out", str(sa_pub))
    return Pki(
        ca=ca,
        apiserver=apiserver,
        admin=admin,
        controller_manager=controller_manager,
        sa_key=sa_key,
        sa_pub=sa_pub,
    )
