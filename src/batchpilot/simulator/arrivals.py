"""The simulator's arrival processes are the load generator's (one traffic model for
measurement and simulation): see `batchpilot.loadgen.arrivals`."""

from batchpilot.loadgen.arrivals import (
    MMPP,
    ArrivalKind,
    ArrivalProcess,
    Constant,
    Poisson,
    Trace,
    TraceError,
    arrival_times,
    describe_arrival,
    load_trace,
    parse_arrival,
)

__all__ = [
    "MMPP",
    "ArrivalKind",
    "ArrivalProcess",
    "Constant",
    "Poisson",
    "Trace",
    "TraceError",
    "arrival_times",
    "describe_arrival",
    "load_trace",
    "parse_arrival",
]
