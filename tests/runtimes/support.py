"""Support for the `runtimes` tier: real inference runtimes started from their own
environments (`scripts/runtimes`). A missing environment skips its tests on a developer
machine and fails them under CI (`CI` set), where `scripts/test` installs them first.
Also: which TCP addresses a process group listens on, from /proc (no ss or psutil)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest

from batchpilot.runtimes.venvs import venv_dir

_LISTEN = "0A"


def _require(path: Path, installer: str) -> None:
    """Skip (or under CI fail) unless `path` exists; `installer` makes it."""
    if path.is_file():
        return
    message = f"{path} is missing: run {installer}"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set, so the runtimes tier must run)")
    pytest.skip(message)


def require_runtime(venv: str, program: str) -> None:
    """Skip (or under CI fail) unless `program` is installed in runtime environment
    `venv`."""
    _require(venv_dir(venv) / "bin" / program, "scripts/runtimes")


def require_engine(python: Path) -> None:
    """Skip (or under CI fail) unless the generative engine whose interpreter is `python`
    is installed (`scripts/engines`, which `scripts/test` runs)."""
    _require(python, "scripts/engines")


def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the fields after the command (which may hold spaces) in parentheses
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    # /proc/net/tcp6 holds four 32-bit words, each in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return ipaddress.IPv6Address(words)


def listening_addresses(pgid: int) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket of the process group."""
    inodes: set[str] = set()
    for pid in group_pids(pgid):
        inodes |= _socket_inodes(pid)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _LISTEN and inode in inodes:
                host, port = local.split(":")
                found.append((str(_address(host)), int(port, 16)))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback
