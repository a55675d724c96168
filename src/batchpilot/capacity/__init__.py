"""Effective-throughput search: the highest sustained rate that keeps the SLA
(DESIGN.md §6), over steps measured by the load generator, Prometheus or a simulator."""
