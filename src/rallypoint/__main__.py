"""`python -m rallypoint` runs the CLI."""

from rallypoint.cli import main

main()
