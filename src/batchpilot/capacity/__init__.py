"""Effective-throughput search: the highest sustained rate that keeps the SLA
over steps measured by the load generator, Prometheus or a simulator
(docs/architecture.md, "How a measurement flows")."""
