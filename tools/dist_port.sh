# Sourced by tools/dist_train.sh and tools/dist_test.sh: sets PORT, torchrun's rendezvous port.
# Unset: 29500, or on one machine (NNODES=1) a free port when 29500 is taken (said on stderr). Set by the user: used
# as it is, and on the machine that hosts the rendezvous (NODE_RANK=0) refused with the fix when it is taken.

# exit status 0 when the TCP port can be bound here (with SO_REUSEADDR, as torchrun's store binds it)
port_free() {
    "$PYTHON" -c "import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(('', int(sys.argv[1])))
except OSError:
    sys.exit(1)" "$1"
}

if [ -z "${PORT:-}" ]; then
    PORT=29500
    if [ "$NNODES" = 1 ] && ! port_free "$PORT"; then
        PORT=$("$PYTHON" -c "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])")
        echo "$(basename "$0"): port 29500 is in use here (another job?): using port $PORT (set PORT= to choose one)" >&2
    fi
elif [ "$NODE_RANK" = 0 ] && ! port_free "$PORT"; then
    echo "error: PORT=$PORT is in use on this machine (another job, or a run that has not ended): torchrun could not" \
         "listen on it. Pick a free one, e.g. PORT=$((PORT + 1)) bash $0 ..., the same on every node." >&2
    exit 1
fi
