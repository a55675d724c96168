"""The package's layers hold: `lint-imports` keeps every import-linter contract in
pyproject.toml (docs/architecture.md, "Layers"): no part imports one above it, no
package has a cycle, and PyTorch, Kopf and matplotlib stay where they belong.

`make lint` runs the same check; this test makes every test run (CI's included) run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# `lint-imports` as a module: importlinter.cli has no `__main__` of its own
LINT_IMPORTS = (
    "import sys; from importlinter.cli import lint_imports_command; "
    "sys.exit(lint_imports_command())"
)


def test_import_contracts_are_kept() -> None:
    # this checkout's source, whatever copy of batchpilot the environment has installed
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert "No module named 'importlinter'" not in output, (
        "import-linter is not installed (the dev extra): run scripts/venv"
    )
    assert done.returncode == 0, f"lint-imports found broken contracts:\n{output}"
    assert "0 broken" in output, output
