"""The `rallypoint` command: flags and RALLYPOINT_* variables in, exit codes out.

The only package that reads os.environ, imports click, configures logging handlers and
maps exceptions to exit codes (0 ok, 1 not ready or failed, 2 bad usage or
configuration, 3 timed out). Everything else receives a frozen Settings and a mapping.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Console-script entry point of `rallypoint`."""
    args = sys.argv[1:]
    if args[:1] == ["serve"]:
        # `serve` starts every sidecar: its options are parsed without click when they can
        # be (fastserve.py), and anything else goes to click below, which says what is wrong.
        from rallypoint.cli import fastserve

        code = fastserve.serve(args[1:])
        if code is not None:
            sys.exit(code)
    from rallypoint.cli.commands import app

    app.main(prog_name="rallypoint")
