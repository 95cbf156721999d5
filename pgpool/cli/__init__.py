"""The ``pgpool`` command: `main` parses it and runs one subcommand (`pgpool.cli.command`);
the operator's commands (`pgpool.cli.operate`), the status page as text
(`pgpool.cli.status`) and reading passwords (`pgpool.cli.passwords`)."""

from .command import main

__all__ = ["main"]
