"""Inference runtimes behind one adapter seam (`base.Runtime`): knobs in native names and
units, live control with verification, persistence, request protocol and metrics per
runtime; found by name in `registry`."""
