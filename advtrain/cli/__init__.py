"""The `advtrain` command line (Typer): run, eval, resume, launch, profile,
show and the rest. Nothing imports this package but the entry point.
"""

from advtrain.cli.commands import app

__all__ = ["app"]
