"""Queueing simulator of dynamic-batching replicas: predicts a configuration's effective
throughput from a fitted batch-cost model, in the same shape the measured capacity
search reports, fast enough to score a whole grid in seconds."""

from batchpilot.simulator.arrivals import (
    MMPP,
    ArrivalProcess,
    Constant,
    Poisson,
    Trace,
    load_trace,
)
from batchpilot.simulator.calibrate import calibrate_cost
from batchpilot.simulator.capacity import simulate_capacity
from batchpilot.simulator.cost import (
    CostModel,
    LinearCost,
    ProfileError,
    TableCost,
    fit_cost_model,
    parse_cost_model,
)
from batchpilot.simulator.engine import Policy, ServerModel, latencies
from batchpilot.simulator.propose import KnobBounds, propose_configs
from batchpilot.simulator.scenario import Scenario, Traffic

__all__ = [
    "MMPP",
    "ArrivalProcess",
    "Constant",
    "CostModel",
    "KnobBounds",
    "LinearCost",
    "Poisson",
    "Policy",
    "ProfileError",
    "Scenario",
    "ServerModel",
    "TableCost",
    "Trace",
    "Traffic",
    "calibrate_cost",
    "fit_cost_model",
    "latencies",
    "load_trace",
    "parse_cost_model",
    "propose_configs",
    "simulate_capacity",
]
