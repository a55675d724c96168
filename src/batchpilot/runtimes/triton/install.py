"""Where the Triton runtime is installed: its own virtual environment (the
`nvidia-pytriton` wheel carries a `tritonserver` binary and the python backend), outside
the project's, created by `scripts/runtimes triton`."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from batchpilot.runtimes.base import LaunchError
from batchpilot.runtimes.venvs import venv_dir

TRITON_VERSION = "2.51"
# The wheel that ships that binary; the install script pins the same.
REQUIREMENT = "nvidia-pytriton==0.7.0"
VENV_NAME = f"triton-{TRITON_VERSION}"


class RuntimeMissing(LaunchError):
    """The runtime's environment is not installed (or is incomplete)."""


def default_venv() -> Path:
    return venv_dir(VENV_NAME)


@dataclass(frozen=True)
class TritonInstall:
    """The files a local Triton with the python backend needs."""

    venv: Path
    python_version: str  # "3.11": picks the matching python backend stub
    python_libdir: Path  # where the venv interpreter's own libpython lives

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        return self.venv / "lib" / f"python{self.python_version}" / "site-packages"

    @property
    def server_dir(self) -> Path:
        return self.site_packages / "pytriton" / "tritonserver"

    @property
    def binary(self) -> Path:
        return self.server_dir / "bin" / "tritonserver"

    @property
    def python_backend(self) -> Path:
        return self.server_dir / "backends" / "python"

    @property
    def stub(self) -> Path:
        return (
            self.server_dir
            / "python_backend_stubs"
            / self.python_version
            / "triton_python_backend_stub"
        )

    @property
    def bundled_libs(self) -> Path:
        return self.site_packages / "nvidia_pytriton.libs"

    def missing(self) -> list[Path]:
        needed = [
            self.binary,
            self.python_backend / "libtriton_python.so",
            self.python_backend / "triton_python_backend_utils.py",
            self.stub,
            self.bundled_libs,
        ]
        return [path for path in needed if not path.exists()]

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with what the server and its python stub need: the interpreter's own
        libpython first on LD_LIBRARY_PATH (a system libpython paired with this
        interpreter's standard library breaks the stub at start), the wheel's bundled
        libraries, and the venv's bin first on PATH (the stub finds numpy through it)."""
        env = dict(base)
        libs = [str(self.python_libdir), str(self.bundled_libs)]
        if env.get("LD_LIBRARY_PATH"):
            libs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
        env["PATH"] = os.pathsep.join(
            [str(self.venv / "bin"), *([env["PATH"]] if env.get("PATH") else [])]
        )
        env["VIRTUAL_ENV"] = str(self.venv)
        env.pop("PYTHONHOME", None)
        env.pop("PYTHONPATH", None)
        return env


_PROBE = (
    "import sys, sysconfig; "
    "print(f'{sys.version_info[0]}.{sys.version_info[1]}'); "
    "print(sysconfig.get_config_var('LIBDIR'))"
)


async def find_install(venv: Path | None = None) -> TritonInstall:
    """The Triton install in `venv` (default: `default_venv()`). Raises RuntimeMissing
    saying what is missing and how to install it."""
    venv = venv or default_venv()
    hint = f"install it with `scripts/runtimes triton` ({REQUIREMENT} into {venv})"
    python = venv / "bin" / "python"
    if not python.exists():
        raise RuntimeMissing(f"Triton {TRITON_VERSION} is not installed: {hint}")
    proc = await asyncio.create_subprocess_exec(
        str(python),
        "-c",
        _PROBE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    lines = out.decode().split()
    if proc.returncode != 0 or len(lines) != 2:
        raise RuntimeMissing(
            f"the Triton environment's interpreter {python} does not run "
            f"({err.decode().strip()[-300:]}): {hint}"
        )
    install = TritonInstall(venv=venv, python_version=lines[0], python_libdir=Path(lines[1]))
    missing = install.missing()
    if missing:
        names = ", ".join(str(path) for path in missing)
        raise RuntimeMissing(f"the Triton install in {venv} is incomplete ({names}): {hint}")
    return install
