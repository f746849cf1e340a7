#!/usr/bin/env bash
# The flake hunt: run test tiers again and again on a machine made worse than CI's, and
# list every test that failed, with the round it failed in.
#
#   sudo bash scripts/flake_hunt.sh [ROUNDS] [PYTEST ARGS...]
#   sudo bash scripts/flake_hunt.sh 5                                  # in-process + multi-host
#   sudo bash scripts/flake_hunt.sh 3 tests/unit tests/hardening -n 4
#
# Beside the tests, until the last round ends:
#   * RALLYPOINT_HUNT_BURNERS (default 2) processes spin on the CPU, so a wait that is too
#     tight, or an assertion made once instead of inside the wait, shows up;
#   * with a Docker engine, a loop creates and removes a Docker network every second, as the
#     compose tier does beside the others: bridges come and go, FORWARD rules are rewritten,
#     mDNS on the host's interfaces sees interfaces vanish.
# Without PYTEST ARGS it runs tests/inprocess and tests/multihost on four workers, grouped as
# scripts/test.sh groups them. Each round's log is kept in the directory printed at the start.
# Exits 1 when any round failed, 0 when none did. Run it after scripts/test.sh (it uses .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${1:-5}
shift || true
args=("$@")
if [ ${#args[@]} -eq 0 ]; then
    args=(tests/inprocess tests/multihost -n 4 --dist loadgroup)
fi
burners=${RALLYPOINT_HUNT_BURNERS:-2}
python=.venv/bin/python
[ -x "$python" ] || { echo "error: no .venv: run scripts/test.sh once first" >&2; exit 2; }

logs=$(mktemp -d /tmp/rallypoint-hunt.XXXXXX)
echo "flake hunt: $rounds rounds of: pytest ${args[*]}; $burners CPU burners; logs in $logs" >&2

pids=()
stop_load() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if command -v docker >/dev/null; then
        docker network rm rallypoint-hunt-churn >/dev/null 2>&1 || true
    fi
}
trap stop_load EXIT

for _ in $(seq "$burners"); do
    "$python" -c "while True: pass" &
    pids+=($!)
done
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    (
        while true; do
            docker network create rallypoint-hunt-churn >/dev/null 2>&1 || true
            sleep 0.5
            docker network rm rallypoint-hunt-churn >/dev/null 2>&1 || true
            sleep 0.5
        done
    ) &
    pids+=($!)
    echo "flake hunt: a Docker network is created and removed every second" >&2
else
    echo "flake hunt: no Docker engine, no network churn" >&2
fi

failed_rounds=0
for round in $(seq "$rounds"); do
    log="$logs/round-$round.log"
    started=$SECONDS
    if CI=true "$python" -m pytest -q -p no:cacheprovider -rf "${args[@]}" >"$log" 2>&1; then
        status=0
    else
        status=$?
    fi
    summary=$(tail -n 1 "$log")
    echo "round $round: exit $status in $((SECONDS - started)) s: $summary"
    if [ "$status" != 0 ]; then
        failed_rounds=$((failed_rounds + 1))
        grep -E '^(FAILED|ERROR) ' "$log" | sed "s/^/  round $round: /" || true
    fi
done
echo "flake hunt: $failed_rounds of $rounds rounds failed; logs in $logs"
[ "$failed_rounds" = 0 ]
