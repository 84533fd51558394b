"""``sloserve``: every command of the project, one module each. The only code that imports sloserve/loadtests/."""

from sloserve.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
