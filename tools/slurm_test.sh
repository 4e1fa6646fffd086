#!/usr/bin/env bash
# Testing a checkpoint on a Slurm cluster:
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#     tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py arguments...]
set -euxo pipefail

PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-$((GPUS < 8 ? GPUS : 8))}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}

# SRUN_ARGS is split into words on purpose: it holds several srun options
# shellcheck disable=SC2086
PYTHONPATH="$(dirname "$0")/..${PYTHONPATH:+:$PYTHONPATH}" \
srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    $SRUN_ARGS \
    ${PYTHON:-python} -u "$(dirname "$0")/test.py" "$CONFIG" "$CHECKPOINT" --launcher=slurm "${@:5}"
