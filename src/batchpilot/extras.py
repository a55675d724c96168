"""Optional dependencies (pyproject extras) and the message a command gives when one is
missing. PyTorch is the `server` extra: only the reference server runs a model, so the
operator, the load generator and the simulator install and run without gigabytes of it."""

from __future__ import annotations

import importlib.util

SERVER_EXTRA = "server"
INSTALL_SERVER = "pip install 'batchpilot[server]'"


def torch_missing(what: str) -> str | None:
    """Why `what` cannot run here when PyTorch is not installed, else None.

    Looks the package up without importing it: importing PyTorch takes seconds and
    hundreds of MB, which a caller that only starts a server process should not pay."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        found = False
    if found:
        return None
    return (
        f"{what} needs PyTorch, which is not installed here; it comes with the "
        f"`{SERVER_EXTRA}` extra: {INSTALL_SERVER}"
    )
