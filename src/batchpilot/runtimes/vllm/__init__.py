"""vLLM's continuous-batching engine (the CPU build, `scripts/engines`) started on this
machine with a tiny random-weight model: its knobs and their command-line mapping
(`knobs`), the server process (`process`)."""
