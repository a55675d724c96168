"""The Dockerfile builds one image per role: the operator without PyTorch (the default
target), the reference server with the `server` extra; the manifests use each."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def stages() -> dict[str, str]:
    """Each stage's name and its instructions."""
    text = (ROOT / "Dockerfile").read_text()
    found: dict[str, str] = {}
    for block in re.split(r"(?m)^(?=FROM )", text):
        header = re.match(r"FROM \S+ AS (\S+)", block)
        if header:
            found[header.group(1)] = block
    return found


def test_operator_image_has_no_pytorch_and_is_the_default_target() -> None:
    found = stages()
    assert list(found)[-1] == "operator"
    assert "--from=build-operator" in found["operator"]
    assert "pip install .\n" in found["build-operator"]
    assert "torch" not in found["build-operator"]
    assert 'CMD ["operator"' in found["operator"]


def test_server_image_installs_the_server_extra() -> None:
    found = stages()
    assert "'.[server]'" in found["build-server"]
    assert "--from=build-server" in found["server"]
    assert 'CMD ["serve"' in found["server"]


def test_pytorch_is_only_in_the_server_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("torch")]
    assert [d for d in project["optional-dependencies"]["server"] if d.startswith("torch")]


def test_manifests_use_the_image_of_their_role() -> None:
    operator = yaml.safe_load((ROOT / "manifests/operator/deployment.yaml").read_text())
    [server] = [
        d
        for d in yaml.safe_load_all((ROOT / "manifests/samples/reference-server.yaml").read_text())
        if d and d["kind"] == "Deployment"
    ]
    assert operator["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
        "batchpilot-operator:"
    )
    assert server["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
        "batchpilot-server:"
    )
