"""The tflab command line (registered in tflab.cli.app)."""

from tflab.cli.app import app, main

__all__ = ["app", "main"]
