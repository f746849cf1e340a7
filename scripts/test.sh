#!/usr/bin/env bash
# Runs every test tier on a fresh machine: system set-up (as root), a venv, lint, types, tests.
# Locally a tier whose prerequisites are missing is skipped with the reason; with CI=true it fails.
#
# The tests run side by side on five pytest-xdist workers (--dist loadgroup): the tiers that
# share one cluster or server on one worker each, and the few tests that measure the machine
# with no busy test beside them (tests/conftest.py, tests/support/quiet.py; docs/testing.md).
# RALLYPOINT_TEST_WORKERS=0 runs them one after another; any pytest flag is passed on.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

if [ "$(id -u)" = 0 ]; then
    bash scripts/setup-system.sh
else
    echo "not root: the multi-host, compose and Slurm tiers will be skipped (run as root for all tiers)" >&2
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
# The real PyTorch client test uses a CPU build; it is a test-only requirement.
.venv/bin/python -m pip install -q 'torch==2.13.0' numpy || {
    echo "torch==2.13.0 could not be installed: the PyTorch tests will be skipped (or fail in CI)" >&2
}
# The real TensorFlow, JAX and DeepSpeed clients of the multi-host tier (CPU builds): test-only.
.venv/bin/python -m pip install -q -e '.[frameworks]' || {
    echo "tensorflow-cpu, jax or deepspeed could not be installed: their tests will be skipped (or fail in CI)" >&2
}
export PATH="$PWD/.venv/bin:$PATH"

ruff check
ruff format --check
mypy
# The compose tier's image is set-up too: built (or found cached) here, before the tests time.
if [ "$(id -u)" = 0 ] && docker info >/dev/null 2>&1; then
    bash scripts/build-images.sh
fi
echo "set-up, lint, types and images took $((SECONDS - started)) s; the tests follow" >&2
exec python -m pytest -ra -n "${RALLYPOINT_TEST_WORKERS:-5}" --dist loadgroup "$@"
