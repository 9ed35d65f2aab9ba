"""`python -m advtrain.cli`: the same as the `advtrain` command."""

from advtrain.cli.commands import app

app(prog_name="advtrain")
