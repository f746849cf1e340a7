"""The `rallypoint` command: flags and RALLYPOINT_* variables in, exit codes out.

The only package that reads os.environ, imports click, configures logging handlers and
maps exceptions to exit codes (0 ok, 1 not ready or failed, 2 bad usage or
configuration, 3 timed out). Everything else receives a frozen Settings and a mapping.
"""

from __future__ import annotations


def main() -> None:
    """Console-script entry point of `rallypoint`."""
    from rallypoint.cli.commands import app

    app.main(prog_name="rallypoint")
