"""Where the runtimes' own virtual environments live (made by `scripts/runtimes`): each
runtime pins packages that clash with BatchPilot's, so it runs from its own."""

from __future__ import annotations

import os
from pathlib import Path

from batchpilot.runtimes.base import LaunchError


def cache_root() -> Path:
    """`$BATCHPILOT_CACHE`, else `$XDG_CACHE_HOME/batchpilot`, else ~/.cache/batchpilot."""
    explicit = os.environ.get("BATCHPILOT_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "batchpilot"


def venv_dir(name: str) -> Path:
    """The environment directory of one runtime, e.g. venv_dir("mlserver-1.7.1")."""
    return cache_root() / "runtimes" / name


def venv_executable(name: str, program: str, *, runtime: str) -> Path:
    """`program` in the environment's bin/; LaunchError says how to install it."""
    path = venv_dir(name) / "bin" / program
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise LaunchError(
            f"{runtime} is not installed: {path} is missing; run scripts/runtimes "
            f"{runtime.lower()} (it installs into {venv_dir(name)})"
        )
    return path
