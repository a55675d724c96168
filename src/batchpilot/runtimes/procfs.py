"""The processes of a process group or a session, read from /proc (no psutil): what a
runtime's stop signals and waits for, as its processes do not all stay in the group of
the process BatchPilot started."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def _stat_fields(entry: Path) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and
    parentheses): state, ppid, pgrp, session, ...; None once the process has gone."""
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def pids(*, pgid: int | None = None, sid: int | None = None, live: bool = True) -> list[int]:
    """The processes of process group `pgid` and/or session `sid`; with `live`, without
    the zombies (exited, not yet reaped)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is None or (live and fields[0] == "Z"):
            continue
        if (pgid is None or int(fields[2]) == pgid) and (sid is None or int(fields[3]) == sid):
            found.append(int(entry.name))
    return found


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`."""
    return pids(pgid=pgid)


def live_session_pids(sid: int, *, but: int | None = None) -> list[int]:
    """The live (not zombie) processes of session `sid`, `but` left out."""
    return [pid for pid in pids(sid=sid) if pid != but]


def signal_all(targets: Iterable[int], sig: int) -> None:
    """Signal processes that may already be gone."""
    for pid in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


async def wait_gone(find: Callable[[], list[int]], timeout_s: float, poll_s: float) -> bool:
    """Whether `find()` has come back empty within `timeout_s` (polled every `poll_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not find():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll_s)
