"""The `advtrain` command line (Typer); nothing imports it but the entry point."""

from advtrain.cli.commands import app

__all__ = ["app"]
