"""The documentation site builds with `mkdocs build --strict`: mkdocs.yml turns broken
links, broken anchors and pages missing from the nav into warnings, which strict mode
makes fatal. And every link of the README into docs/ reaches a built page and, with a
`#fragment`, a heading on it. Without mkdocs-material (the dev extra) the tests skip on
a developer machine and fail under CI (`CI` set), where `scripts/test` installs it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 180


def _require_mkdocs() -> None:
    missing = [name for name in ("mkdocs", "material") if importlib.util.find_spec(name) is None]
    if not missing:
        return
    message = f"cannot import {', '.join(missing)}: install the dev extra (mkdocs-material)"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set, so the docs must build)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `mkdocs build --strict` writes it."""
    _require_mkdocs()
    site_dir = tmp_path_factory.mktemp("docs") / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)]
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert result.returncode == 0, (
        f"`{' '.join(command[1:])}` failed (exit {result.returncode}):\n"
        f"{result.stdout}{result.stderr}"
    )
    return site_dir


def test_the_docs_build_strictly(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "operator" / "crd-reference" / "index.html").is_file()


def _readme_links() -> list[str]:
    """The targets of the README's Markdown links into docs/."""
    text = (ROOT / "README.md").read_text()
    return re.findall(r"\]\((docs/[^)\s]+)\)", text)


def _built(site: Path, page: Path) -> Path:
    """The HTML file MkDocs writes for docs/<page> (directory URLs)."""
    if page.name == "index.md":
        return site / page.parent / "index.html"
    return site / page.with_suffix("") / "index.html"


def test_the_readmes_links_into_the_docs_resolve(site: Path) -> None:
    links = _readme_links()
    assert links, "the README links into docs/"
    broken = []
    for link in links:
        target, _, fragment = link.partition("#")
        page = Path(target).relative_to("docs")
        if not (ROOT / "docs" / page).is_file():
            broken.append(f"{link}: no such file")
        elif fragment and f'id="{fragment}"' not in _built(site, page).read_text():
            broken.append(f"{link}: no heading with that anchor")
    assert not broken, "README links that do not resolve:\n" + "\n".join(broken)
