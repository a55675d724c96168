"""Helpers shared by the test tiers and the benchmarks, kept out of the package: a stub
inference endpoint with a set behaviour (`stub_server`) and a real Prometheus on a
loopback port (`prometheus_process`).

Pytest finds this package through `pythonpath` in pyproject.toml; the benchmarks, run
as scripts, through `benchmarks/suite_support.py`."""
