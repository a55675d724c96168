"""Sleeps that end on time, for the generator's dispatcher.

asyncio wakes a timer through the selector, and epoll's timeout is whole milliseconds,
rounded up: a send scheduled at t leaves between t and t + 1 ms, 0.7 ms late on average
on an idle machine, and that lag counts against every request's latency. On Linux a
timerfd armed at the absolute send time (CLOCK_MONOTONIC, the clock asyncio's `loop.time()`
reads) becomes readable within microseconds of it and wakes the same epoll. Elsewhere,
or where the call is refused, the waker falls back to the loop's own timers."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import math
import os
import sys
import time
from collections.abc import Callable
from types import TracebackType

__all__ = ["Waker"]

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _TimerFd:
    """One non-blocking timerfd on CLOCK_MONOTONIC, armed at absolute times."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._settime = libc.timerfd_settime
        self._settime.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.c_void_p,
        ]
        self._settime.restype = ctypes.c_int
        create = libc.timerfd_create
        create.argtypes = [ctypes.c_int, ctypes.c_int]
        create.restype = ctypes.c_int
        fd = create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        self.fd = fd
        self._spec = _Itimerspec()

    def arm(self, at: float) -> None:
        """Fire once at monotonic time `at` (seconds); a time already past fires at once."""
        frac, whole = math.modf(max(at, 1e-9))
        self._spec.it_value.tv_sec = int(whole)
        # zero in both fields would disarm the timer instead
        self._spec.it_value.tv_nsec = max(int(frac * 1e9), 1 if whole == 0 else 0)
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    def clear(self) -> None:
        # woken by a timer that was re-armed meanwhile: nothing to read
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)

    def close(self) -> None:
        os.close(self.fd)


def _timerfd() -> _TimerFd | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return _TimerFd(ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True))
    except (OSError, AttributeError):
        return None


class Waker:
    """`call_at(t, callback)` on one event loop: run `callback` at loop time `t` or just
    after, precisely on Linux (a timerfd registered with the loop), through the loop's own
    timers elsewhere. One callback is pending at a time: a new one replaces it. Use as a
    context manager inside the running loop, so the descriptor is released."""

    def __init__(self, *, precise: bool = True) -> None:
        self._timer = _timerfd() if precise else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._callback: Callable[[], None] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0

    @property
    def precise(self) -> bool:
        return self._timer is not None

    def __enter__(self) -> Waker:
        self._loop = asyncio.get_running_loop()
        if self._timer is not None:
            if time.get_clock_info("monotonic").implementation != "clock_gettime(CLOCK_MONOTONIC)":
                self._timer.close()
                self._timer = None
            else:
                self._loop.add_reader(self._timer.fd, self._fired)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()
        if self._timer is not None and self._loop is not None:
            self._loop.remove_reader(self._timer.fd)
            self._timer.close()
            self._timer = None

    def call_at(self, at: float, callback: Callable[[], None]) -> None:
        """Run `callback` at loop time `at` or just after (on the next pass if it has
        passed), instead of any callback still pending."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("use the waker inside `with`")
        self.cancel()
        self._callback, self._at = callback, at
        if self._timer is None:
            self._handle = loop.call_at(at, self._fired)
        else:
            self._timer.arm(at)

    def cancel(self) -> None:
        """Drop the pending callback, if any."""
        self._callback = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fired(self) -> None:
        if self._timer is not None:
            self._timer.clear()
            if self._loop is not None and self._loop.time() < self._at:
                self._timer.arm(self._at)  # readiness left from a timer since re-armed
                return
        self._handle = None
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()
