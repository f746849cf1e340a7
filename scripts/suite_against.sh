#!/usr/bin/env bash
# Time the whole test suite of this checkout and of an earlier commit, alternating, on this
# machine, and print each run's time as pytest reports it and the machine's CPU-seconds.
#
#   sudo bash scripts/suite_against.sh REV [ROUNDS] [PYTEST_ARG...]
#   sudo bash scripts/suite_against.sh 42dd19d 1        # the commit before #31's work began
#
# The speed of a virtual machine's cores differs from day to day (docs/testing.md), so a
# suite's time is only comparable with another measured beside it. Each side runs the pytest
# command that its own scripts/test.sh ends with, in its own venv, with CI=true, after its
# own set-up (that scripts/test.sh run with --collect-only) and with its own image built:
# set-up and images are not timed on either side. REV is checked out in a worktree under
# ${SUITE_AGAINST_DIR:-/tmp/rallypoint-suite-against}; its venv stays there for the next run.
# Extra arguments go to both sides' pytest. Run it on an otherwise quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
HERE="$PWD"

REV="${1:?usage: scripts/suite_against.sh REV [ROUNDS] [PYTEST_ARG...]}"
ROUNDS="${2:-1}"
shift $(($# < 2 ? $# : 2))
THERE="${SUITE_AGAINST_DIR:-/tmp/rallypoint-suite-against}"
LOGS="$THERE.logs"
mkdir -p "$LOGS"

log() { printf 'suite_against: %s\n' "$*" >&2; }

if [ ! -d "$THERE/.git" ] && [ ! -f "$THERE/.git" ]; then
    git worktree add --force --detach "$THERE" "$REV" >&2
else
    git -C "$THERE" checkout --quiet --detach "$REV"
fi
log "this: $(git rev-parse --short HEAD); against: $(git -C "$THERE" rev-parse --short HEAD)"

prepare() {  # DIR TAG: that checkout's own set-up (system, venv, lint, types, image)
    log "set-up of $1 (not timed)"
    (cd "$1" && CI=true bash scripts/test.sh --collect-only -q >"$LOGS/setup-$2.log" 2>&1) || {
        log "set-up of $1 failed: $LOGS/setup-$2.log"
        exit 1
    }
}

timed() {  # DIR TAG [PYTEST_ARG...]: that checkout's pytest command, under scripts/busy.py
    local dir="$1" tag="$2" command
    shift 2
    if [ "$(id -u)" = 0 ] && docker info >/dev/null 2>&1; then
        (cd "$dir" && bash scripts/build-images.sh >"$LOGS/images-$tag.log" 2>&1)
    fi
    command="$(sed -n 's/^exec //p' "$dir/scripts/test.sh" | tail -n 1)"
    log "$tag: $command"
    (
        cd "$dir"
        export CI=true PATH="$dir/.venv/bin:$PATH"
        python "$HERE/scripts/busy.py" -- bash -c "$command" "$tag" "$@"
    ) >"$LOGS/$tag.log" 2>&1 || true
    local summary busy
    summary="$(grep -E '(passed|failed|error).* in [0-9.]+s' "$LOGS/$tag.log" | tail -n 1 | tr -d '=')"
    busy="$(grep '^busy.py:' "$LOGS/$tag.log" | tail -n 1)"
    printf '%-10s %s |%s\n' "$tag" "${summary:-no summary (see $LOGS/$tag.log)}" "${busy#busy.py:}"
}

prepare "$THERE" against
prepare "$HERE" this
for round in $(seq 1 "$ROUNDS"); do
    timed "$THERE" "against-$round" "$@"
    timed "$HERE" "this-$round" "$@"
done
log "logs in $LOGS"
