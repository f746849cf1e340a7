#!/bin/sh
# A job in any language for `rallypoint run`: one progress mark per step.
#
#     rallypoint run --stall-timeout 60 -- sh train_loop.sh 1000
#
# Each step writes its number into $RALLYPOINT_PROGRESS_FILE before it starts; a step that
# takes longer than --stall-timeout is a hang, named on every node with its step
# (docs/run.md "Hangs: progress and stalls"). Without `run` the file is not set, and the
# loop runs unwatched.
set -eu
steps=${1:-100}
mark=${RALLYPOINT_PROGRESS_FILE:-/dev/null}
step=0
while [ "$step" -lt "$steps" ]; do
    step=$((step + 1))
    echo "$step step" > "$mark"
    sleep 0.1 # one step of the work
done
echo "done after $steps steps"
