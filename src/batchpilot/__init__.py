"""BatchPilot: tune dynamic batching for effective throughput within a p99 SLA."""
