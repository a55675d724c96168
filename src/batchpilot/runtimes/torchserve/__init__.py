"""TorchServe 0.12 through the adapter seam: the bundled handler, model archives and
config.properties, the local launcher, the control (new version, set-default, delete the
old) and the adapter."""
