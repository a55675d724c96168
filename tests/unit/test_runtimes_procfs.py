"""The one /proc walker the runtimes' stops rely on: processes by group and session,
zombies (exited, not reaped) left out unless asked for."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from batchpilot.runtimes.procfs import group_members, live_session_pids, pids


def test_this_process_is_found_by_its_group_and_its_session() -> None:
    me = os.getpid()
    assert me in group_members(os.getpgid(0))
    assert me in live_session_pids(os.getsid(0))
    assert me not in live_session_pids(os.getsid(0), but=me)
    assert me in pids(pgid=os.getpgid(0), sid=os.getsid(0))


def test_a_zombie_is_not_live() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10.0
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        assert pids(sid=child.pid, live=False) == [child.pid]
        assert live_session_pids(child.pid) == []
        assert group_members(child.pid) == []
    finally:
        child.wait()
    assert pids(sid=child.pid, live=False) == []
