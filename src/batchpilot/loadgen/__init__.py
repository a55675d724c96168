"""Open-loop load generation: request mixes, arrival schedules, latency histograms and the
generator that drives an HTTP endpoint (docs/architecture.md, "How a measurement flows")."""
