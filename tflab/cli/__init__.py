"""The command line: thin Typer commands over the layers below; the only code that prints.

Every command is registered in `app`, which is also the one error boundary.
"""

from tflab.cli.app import app, main

__all__ = ["app", "main"]
