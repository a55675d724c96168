"""The `batchpilot` command. Subcommands live beside the part they drive and are imported
only when used, so `batchpilot operator` never pays for importing PyTorch."""

from __future__ import annotations

import importlib

import click

# name -> "module:attribute" of a click command
SUBCOMMANDS: dict[str, str] = {
    "serve": "batchpilot.server.cli:serve",
    "operator": "batchpilot.operator.cli:operator",
    "tune": "batchpilot.tuner.cli:tune",
    "simulate": "batchpilot.simulator.cli:simulate",
    "loadtest": "batchpilot.loadgen.cli:loadtest",
    "load-worker": "batchpilot.loadgen.worker_cli:load_worker",
    "capacity": "batchpilot.capacity.cli:capacity",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="batchpilot")
def main() -> None:
    """Find the dynamic-batching settings that give the most effective throughput
    within a p99 latency SLA."""
