"""Ray Serve as a BatchPilot runtime (`--runtime ray`)."""
