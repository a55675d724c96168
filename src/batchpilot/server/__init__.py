"""The reference inference server: built-in PyTorch models behind a dynamic batcher,
served over HTTP with Prometheus metrics and live reconfiguration.

Importing this package is cheap; PyTorch is imported only by the modules that run
models, so `batchpilot.server.process` can be used by tests and tools without it.
"""
