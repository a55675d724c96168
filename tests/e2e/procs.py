"""Child processes of the e2e harness, each in its own process group, stopped by PID.

Every process the harness starts (etcd, the API server, pods, Prometheus, the operator)
goes through `spawn`, which records it; `stop_all` runs from the session fixture's
finalizer and again from `atexit`, so an interrupted or failing run leaves nothing
behind. The kernel's parent-death signal covers the case where pytest itself is killed.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_registry: dict[int, subprocess.Popen[bytes]] = {}
_lock = threading.Lock()


def die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGKILL it when the
    # thread that spawned it exits, so `kill -9` of pytest cannot orphan a server.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(
    args: Sequence[str],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start `args` in a new session (its own process group), output appended to `log`.

    Call it from a thread that lives as long as the process should: the parent-death
    signal fires when the spawning *thread* exits."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    with _lock:
        _registry[proc.pid] = proc
    return proc


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> int:
    """SIGTERM the process group, SIGKILL it after `grace_s`; the exit code."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=10)
    # Children that outlived the leader are still in its group.
    _signal_group(proc, signal.SIGKILL)
    with _lock:
        _registry.pop(proc.pid, None)
    return proc.returncode


def kill(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL the whole group at once, as `kill -9` would; the exit code."""
    _signal_group(proc, signal.SIGKILL)
    proc.wait(timeout=10)
    with _lock:
        _registry.pop(proc.pid, None)
    return proc.returncode


def stop_all(grace_s: float = 5.0) -> None:
    """Stop every process still registered, newest first (dependents before what they
    depend on: pods before the API server before etcd)."""
    with _lock:
        procs = list(reversed(_registry.values()))
    for proc in procs:
        stop(proc, grace_s)


def running() -> list[int]:
    with _lock:
        return [pid for pid, proc in _registry.items() if proc.poll() is None]


def wait_until(predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.2) -> bool:
    """Poll `predicate()` until it is truthy or `timeout_s` passes; whether it was."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def tail(log: Path, limit: int = 3000) -> str:
    try:
        data = log.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", errors="replace")


atexit.register(stop_all)
