"""Exceptions that cross the layers: raised in a lower part (a runtime adapter's
control, the operator's world of pods) and handled in a higher one (the tuner's runner,
the operator's study), so they live below both."""

from __future__ import annotations


class TargetError(RuntimeError):
    """The target could not be brought to the requested configuration; the trial fails
    with this message as its reason."""


class RequestShapeError(TargetError):
    """The server refused the very first requests with a 4xx: they are not shaped as its
    model takes them, so no measurement can start. The message carries the server's
    words and the flag that sets the requests."""
