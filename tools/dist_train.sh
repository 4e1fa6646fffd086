#!/usr/bin/env bash
# Data-parallel training on one or more machines with torchrun:
#   tools/dist_train.sh CONFIG GPUS [train.py arguments...]
# GPUS is the number of processes on this machine (on a CPU-only machine: processes, using gloo).
# Several machines: set NNODES, NODE_RANK, MASTER_ADDR and PORT on each (defaults: 1, 0, 127.0.0.1, 29500).
# On one machine a taken default port is replaced by a free one; a PORT you set is used as it is (tools/dist_port.sh).
set -euo pipefail

CONFIG=$1
GPUS=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
PYTHON=${PYTHON:-python}

. "$(dirname "$0")/dist_port.sh"

# A run stopped by SIGTERM / SIGUSR1 (Slurm's preemption, time limit, --signal) saves a checkpoint and its ranks exit
# with 128 + the signal; torchrun reports that as a failure (exit 1). Rank 0 writes its status to STOP_STATUS_FILE,
# and this script exits with it: 143 (SIGTERM) or 138 (SIGUSR1) means "saved, resume with --resume".
STOP_STATUS_FILE=$(mktemp)
export MMVISATT_STOP_STATUS_FILE=$STOP_STATUS_FILE
trap 'rm -f "$STOP_STATUS_FILE"' EXIT
# torchrun ends on SIGUSR1 before its ranks have saved: it ignores it (its ranks install their own handler); this
# shell waits for torchrun through the signals Slurm sends every process of the step
trap '' USR1
trap ':' TERM
PYTHONPATH="$(dirname "$0")/..${PYTHONPATH:+:$PYTHONPATH}" \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$(dirname "$0")/train.py" \
    "$CONFIG" \
    --launcher pytorch "${@:3}" &
RUN=$!
# a wait that a trapped signal interrupts returns early; the next one returns the exit status (a finished torchrun
# answers kill -0 until it is waited for)
while :; do
    wait "$RUN" && status=0 || status=$?
    kill -0 "$RUN" 2>/dev/null || break
done
if [ -s "$STOP_STATUS_FILE" ]; then
    exit "$(cat "$STOP_STATUS_FILE")"
fi
exit "$status"
