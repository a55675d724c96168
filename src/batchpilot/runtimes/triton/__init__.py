"""Triton Inference Server: the launcher for a local one with the bundled model, and the
live batching change through explicit model control, verified by Triton's own metrics."""
