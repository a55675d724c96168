"""Where a cost model comes from: a JSON file (a cost model, or a saved profile) or a
running server's `GET /admin/profile`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from batchpilot.httpbody import MAX_CONTROL_BODY_BYTES, BodyTooLarge, json_capped
from batchpilot.simulator.cost import (
    LinearCost,
    ProfileError,
    TableCost,
    fit_cost_model,
    parse_cost_model,
)

PROFILE_PATH = "/admin/profile"
PROFILE_TIMEOUT_S = 10.0


def cost_model_from_json(data: Any, *, overhead_ms: float = 0.0) -> LinearCost | TableCost:
    """A saved cost model as it is, or a saved profile (it has "batches") fitted."""
    if isinstance(data, dict) and "batches" in data:
        return fit_cost_model(data, overhead_ms=overhead_ms)
    model = parse_cost_model(data)
    return model.model_copy(update={"overhead_ms": overhead_ms}) if overhead_ms else model


def load_cost_model(path: Path, *, overhead_ms: float = 0.0) -> LinearCost | TableCost:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ProfileError(f"cannot read cost model {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(
            f"cost model {path} is not JSON: {exc.msg} at line {exc.lineno}"
        ) from None
    return cost_model_from_json(data, overhead_ms=overhead_ms)


def profile_url(base_url: str) -> str:
    """Accept the server's base URL or the profile URL itself."""
    base = base_url.rstrip("/")
    return base if base.endswith(PROFILE_PATH) else base + PROFILE_PATH


async def fetch_profile(base_url: str, *, timeout_s: float = PROFILE_TIMEOUT_S) -> dict[str, Any]:
    url = profile_url(base_url)
    if not url.startswith(("http://", "https://")):
        raise ProfileError(f"profile URL {base_url!r} must start with http:// or https://")
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(url) as response,
        ):
            if response.status != 200:
                raise ProfileError(f"GET {url} answered HTTP {response.status}")
            data = await json_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=url)
    except BodyTooLarge as exc:
        raise ProfileError(f"cannot fetch the profile: {exc}") from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        detail = str(exc) or type(exc).__name__
        raise ProfileError(f"cannot fetch the profile from {url}: {detail}") from None
    except json.JSONDecodeError:
        raise ProfileError(f"GET {url} did not answer JSON") from None
    if not isinstance(data, dict):
        raise ProfileError(f"GET {url} answered {type(data).__name__}, expected a JSON object")
    return data
