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

PYTHONPATH="$(dirname "$0")/..${PYTHONPATH:+:$PYTHONPATH}" \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$(dirname "$0")/train.py" \
    "$CONFIG" \
    --launcher pytorch "${@:3}"
