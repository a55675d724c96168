"""The Argo CD health check in docs/operator/gitops.md, run by a Lua interpreter on statuses the
operator's own code writes. Skipped outside CI where no `lua` is installed (Argo CD embeds its
own; the check only needs plain Lua 5.x)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from batchpilot.operator import decisions, kstatus
from batchpilot.operator.status import InferenceServiceStatus

DOC = Path(__file__).resolve().parents[2] / "docs" / "operator" / "gitops.md"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
LUA = shutil.which("lua") or shutil.which("lua5.4") or shutil.which("lua5.3")

# scripts/system-deps installs Lua: under CI a missing interpreter fails instead of skipping
pytestmark = pytest.mark.skipif(
    LUA is None and not os.environ.get("CI"), reason="no Lua interpreter installed"
)


def health_script() -> str:
    text = DOC.read_text()
    block = text.split("resource.customizations.health.batchpilot.dev_InferenceService: |")[1]
    lines = []
    for line in block.splitlines()[1:]:
        if line.strip() == "```":
            break
        lines.append(line[4:])
    return "\n".join(lines)


def lua_literal(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    items = (f"[{json.dumps(k)}] = {lua_literal(v)}" for k, v in value.items())
    return "{" + ", ".join(items) + "}"


def health(obj: dict[str, Any]) -> tuple[str, str]:
    assert LUA is not None
    program = (
        f"obj = {lua_literal(obj)}\n"
        f"local function check()\n{health_script()}\nend\n"
        "local hs = check()\nio.write(hs.status, '\\n', hs.message or '')\n"
    )
    out = subprocess.run([LUA, "-"], input=program, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    status, _, message = out.stdout.partition("\n")
    return status, message


def resource(status: InferenceServiceStatus | None, generation: int = 2) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "resnet", "generation": generation}}
    if status is not None:
        obj["status"] = kstatus.with_kstatus(status, NOW).model_dump(mode="json", by_alias=True)
    return obj


def test_the_health_check_reads_the_operator_statuses() -> None:
    assert re.search(r"\bhs\.status = \"Healthy\"", health_script())
    assert health(resource(None))[0] == "Progressing"
    running = InferenceServiceStatus(phase="Tuning", observed_generation=2, message="trial 3")
    assert health(resource(running)) == ("Progressing", "trial 3")
    converged = InferenceServiceStatus(phase="Converged", observed_generation=2, message="done")
    assert health(resource(converged)) == ("Healthy", "done")
    # a converged study of an older generation: the new spec is not taken in yet
    assert health(resource(converged, generation=3))[0] == "Progressing"
    failed = InferenceServiceStatus(phase="Failed", observed_generation=2, message="study failed")
    assert health(resource(failed)) == ("Degraded", "study failed")
    degraded = decisions.set_condition(
        [], type="Degraded", status="True", reason="RolledBack", message="crash loop",
        generation=2, now=NOW,
    )  # fmt: skip
    rolled_back = converged.model_copy(update={"conditions": degraded})
    assert health(resource(rolled_back)) == ("Degraded", "crash loop")
    paused = decisions.set_condition(
        [], type="Suspended", status="True", reason="Suspended", message="suspended",
        generation=2, now=NOW,
    )  # fmt: skip
    suspended = running.model_copy(update={"conditions": paused, "suspended": True})
    assert health(resource(suspended)) == ("Suspended", "suspended")
