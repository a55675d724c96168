"""The knobs as environment variables (apply.method Env): the unit the queue-wait
variable is written in, and whether a pod runs what was rolled out.

A variable carries the canonical batch cap (requests) as it is; the queue wait is
written in the unit its reader expects: the unit the variable's name states
(`..._MS`, `..._US`, `..._S`), else the unit of the runtime's own knob (MLServer's
`max_batch_time` seconds, Triton's `max_queue_delay_microseconds` whole µs,
TorchServe's `maxBatchDelay` whole ms, Ray Serve's `batch_wait_timeout_s` seconds),
else milliseconds. Pure: `world.py` writes the variables and reads the pods back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from batchpilot.runtimes.base import Knob

WaitUnit = Literal["ms", "us", "s"]
# how many of a unit make one millisecond
PER_MS: Final[Mapping[WaitUnit, float]] = {"s": 1e-3, "ms": 1.0, "us": 1e3}
# the unit a variable's name ends with; the longer spellings first
_NAMED_UNITS: Final[tuple[tuple[str, WaitUnit], ...]] = (
    ("_MILLISECONDS", "ms"),
    ("_MICROSECONDS", "us"),
    ("_SECONDS", "s"),
    ("_MS", "ms"),
    ("_US", "us"),
    ("_S", "s"),
)
_WAIT_UNITS: Final[Mapping[str, WaitUnit]] = {"ms": "ms", "us": "us", "s": "s"}
# significant digits a converted value keeps: a float's noise never reaches the variable
_DIGITS = 12


@dataclass(frozen=True)
class WaitEncoding:
    """How the queue wait is written in its variable: `unit`, and whole units only where
    the reader takes no fractions (Triton's µs, TorchServe's ms)."""

    unit: WaitUnit = "ms"
    integer: bool = False

    def to_env(self, wait_ms: float) -> str:
        native = _clean(float(wait_ms) * PER_MS[self.unit])
        if self.integer:
            return str(round(native))
        return str(int(native)) if native.is_integer() else f"{native:g}"

    def from_env(self, value: float) -> float:
        """The canonical wait (ms) of a variable's value."""
        return _clean(value / PER_MS[self.unit])

    def describe(self) -> str:
        whole = "whole " if self.integer else ""
        return {"ms": f"{whole}milliseconds", "us": f"{whole}microseconds", "s": "seconds"}[
            self.unit
        ]


MILLISECONDS: Final = WaitEncoding()


def _clean(value: float) -> float:
    return float(f"{value:.{_DIGITS}g}") if math.isfinite(value) else value


def unit_in_name(variable: str) -> WaitUnit | None:
    """The unit a variable's name states (`MAX_QUEUE_TIME_MS`: ms), None when it states none."""
    upper = variable.upper()
    return next((unit for suffix, unit in _NAMED_UNITS if upper.endswith(suffix)), None)


def wait_encoding(variable: str, knob: Knob | None) -> WaitEncoding:
    """How the wait is written in `variable`, given the runtime's own wait knob (None:
    a runtime without an adapter). The name wins: a start script that converts
    `MAX_QUEUE_TIME_MS` itself gets milliseconds whatever the runtime."""
    named = unit_in_name(variable)
    own = _WAIT_UNITS.get(knob.unit) if knob is not None else None
    if knob is None or own is None:
        return WaitEncoding(named or "ms")
    unit = named or own
    return WaitEncoding(unit, integer=knob.integer and unit == own)


def resolution_ms(knob: Knob | None) -> float:
    """The step of a read-back wait in ms: one native unit where the runtime reports
    whole ones (a container may truncate where the operator rounded), else 0."""
    own = _WAIT_UNITS.get(knob.unit) if knob is not None else None
    if knob is None or own is None or not knob.integer:
        return 0.0
    return 1.0 / PER_MS[own]


def _show(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{float(value):g}"


def env_ignored(
    *,
    expected: Mapping[str, float | int],
    read: Mapping[str, float | int],
    names: Mapping[str, str],
    written: Mapping[str, str | None],
    tolerance_ms: float = 0.0,
) -> str | None:
    """How a pod's own report of its knobs (`read`, canonical) differs from what the
    rolled-out variables carry (`expected`, canonical, as parsed back from `written`);
    None when it runs them. Only the knobs both sides know are compared: the batch cap
    exactly, the wait within `tolerance_ms` and a float's rounding."""
    wrong: list[str] = []
    for param, want in expected.items():
        if param not in read or param not in names:
            continue
        got = read[param]
        if param == "max_batch_size":
            same = round(float(got)) == round(float(want))
        else:
            slack = tolerance_ms + 1e-9 + 1e-6 * abs(float(want))
            same = abs(float(got) - float(want)) <= slack
        if not same:
            wrong.append(f"{param}={_show(got)} after {names[param]}={written.get(names[param])}")
    if not wrong:
        return None
    variables = "variable" if len(wrong) == 1 else "variables"
    return (
        f"runs {'; '.join(wrong)} was rolled out: the container does not read the "
        f"{variables} (every trial would measure the same configuration); pass them to the "
        "server (e.g. args: --max-batch-size=$(MAX_BATCH_SIZE)), check the wait's unit "
        "(apply.env names the variables; their unit follows the name's suffix or "
        "spec.runtime.kind), or tune it with apply.method Live"
    )
