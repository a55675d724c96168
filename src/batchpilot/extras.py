"""Optional dependencies (pyproject extras) and the message a command gives when one is
missing. PyTorch is the `server` extra: only the reference server runs a model, so the
operator, the load generator and the simulator install and run without gigabytes of it.
Matplotlib is the `plot` extra: only `capacity --plot` and `tune --report` draw."""

from __future__ import annotations

import importlib.util

SERVER_EXTRA = "server"
INSTALL_SERVER = "pip install 'batchpilot[server]'"
PLOT_EXTRA = "plot"
INSTALL_PLOT = "pip install 'batchpilot[plot]'"


def _installed(package: str) -> bool:
    """Whether `package` can be imported here, looked up without importing it: importing
    PyTorch or matplotlib takes seconds, which a caller that only checks should not pay."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        return False


def _missing(what: str, package: str, name: str, extra: str, install: str) -> str | None:
    if _installed(package):
        return None
    return (
        f"{what} needs {name}, which is not installed here; it comes with the "
        f"`{extra}` extra: {install}"
    )


def torch_missing(what: str) -> str | None:
    """Why `what` cannot run here when PyTorch is not installed, else None."""
    return _missing(what, "torch", "PyTorch", SERVER_EXTRA, INSTALL_SERVER)


def matplotlib_missing(what: str) -> str | None:
    """Why `what` cannot run here when matplotlib is not installed, else None."""
    return _missing(what, "matplotlib", "matplotlib", PLOT_EXTRA, INSTALL_PLOT)


def gp_sampler_missing() -> str | None:
    """Why the GP sampler cannot run here (Optuna's GPSampler fits with PyTorch), else None."""
    missing = torch_missing("sampler GP (Optuna's GPSampler)")
    if missing is None:
        return None
    return f"{missing}; choose TPE (the default) or Random"
