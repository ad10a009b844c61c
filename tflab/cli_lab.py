from tflab.cli import app  # noqa: F401
