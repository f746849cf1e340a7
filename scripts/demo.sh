#!/usr/bin/env bash
# Runs a demo cluster on this machine: N sidecars on loopback, each node's env and time to ready.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q -e .
exec .venv/bin/rallypoint demo --nodes "${1:-3}"
