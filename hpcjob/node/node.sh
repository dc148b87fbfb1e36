# hpcjob node helper, sourced by every hpcjob task before torchrun:  . .hpcjob/node.sh STORE_NODE RUN_ID
#
# The task command line is identical on every node; what differs per node is decided here, on the
# node itself:
#   HPCJOB_IS_HOST  1 on the node that hosts the c10d rendezvous store, else 0. torchrun's own guess
#                   compares host names, and HPC Pack node names (upper case, short) often differ from
#                   Linux host names, so we compare the HPC Pack name of this node (from CCP_NODES,
#                   "1 NODE cores") with STORE_NODE, ignoring case and domain.
#   HPCJOB_ADDR     the address torchrun advertises (--local_addr), and GLOO/NCCL_SOCKET_IFNAME: the
#                   node's routable interface, not what its host name resolves to (127.0.1.1 on a stock
#                   Debian/Ubuntu /etc/hosts). Set HPCJOB_IFNAME (and HPCJOB_ADDR) to choose.
#   HPCJOB_EXIT_DIR where the worker shim records a failing rank's exit code; on exit the task takes
#                   the code of this node's first failing rank instead of torchrun's generic 1, and
#                   writes "<code> <time>" to logs/RUN_ID/NODE.exit: it tells `hpcjob logs --follow`
#                   the task ended, and when (the first node to end badly is a job's root cause).
#   HPCJOB_BEAT_DIR where each rank beats when the job has HPCJOB_BEAT_S (--hang-timeout; worker.py).
#   HPCJOB_TASK_START when this task started (Unix time, seconds with a fraction): the training program
#                   says how long after it the first step was done.
#   HPCJOB_SECRETS_FILE (in the job's environment, with --secret) the attempt's file of NAME=value lines,
#                   only its owner's to read: each becomes a variable of the task, read without tracing
#                   (a `set -x` shows no value) and never printed; the follower removes the file when the
#                   attempt ends. Only the file's name is in the job, which every cluster user can read.
# The job's environment names the run's own checkpoint folder, HPCJOB_CHECKPOINT_DIR, and its output
# folder, HPCJOB_OUTPUT_DIR (what `hpcjob pull` brings home besides them): made here, so that a script may
# save into them at once.

# First, so that it is the task's start: bash's own clock (no process started for it; its decimal point is
# the locale's), else date's.
HPCJOB_TASK_START=${EPOCHREALTIME:-$(date +%s.%N)}
HPCJOB_TASK_START=${HPCJOB_TASK_START/,/.}
hpcjob_store=${1%%.*}
HPCJOB_NODE=${CCP_NODES#* }
HPCJOB_NODE=${HPCJOB_NODE%% *}
if [ -z "$CCP_NODES" ] || [ -z "$HPCJOB_NODE" ]; then
    HPCJOB_NODE=$(hostname)
fi
HPCJOB_NODE=${HPCJOB_NODE%%.*}
if [ "${HPCJOB_NODE^^}" = "${hpcjob_store^^}" ]; then HPCJOB_IS_HOST=1; else HPCJOB_IS_HOST=0; fi

if [ -z "$HPCJOB_IFNAME" ]; then
    # The interface of the default route, else the first one with a global IPv4 address.
    HPCJOB_IFNAME=$(ip -o -4 route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit }}')
    [ -n "$HPCJOB_IFNAME" ] || HPCJOB_IFNAME=$(ip -o -4 addr show scope global 2>/dev/null | awk '{print $2; exit}')
fi
if [ -z "$HPCJOB_ADDR" ]; then
    HPCJOB_ADDR=$(ip -o -4 addr show dev "$HPCJOB_IFNAME" 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
fi
if [ -z "$HPCJOB_IFNAME" ] || [ -z "$HPCJOB_ADDR" ]; then
    echo "hpcjob: no IPv4 address found on ${HPCJOB_IFNAME:-any interface}; set HPCJOB_IFNAME" >&2
    exit 1
fi
: "${GLOO_SOCKET_IFNAME:=$HPCJOB_IFNAME}" "${NCCL_SOCKET_IFNAME:=$HPCJOB_IFNAME}"
HPCJOB_LOG_DIR="$PWD/logs/$2"
HPCJOB_EXIT_DIR="$HPCJOB_LOG_DIR/.hpcjob-exits"
HPCJOB_BEAT_DIR="$HPCJOB_LOG_DIR/.hpcjob-beats"
export HPCJOB_NODE HPCJOB_IS_HOST HPCJOB_IFNAME HPCJOB_ADDR HPCJOB_LOG_DIR HPCJOB_EXIT_DIR HPCJOB_BEAT_DIR GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME HPCJOB_TASK_START
unset hpcjob_store
[ -z "$HPCJOB_CHECKPOINT_DIR" ] || mkdir -p "$HPCJOB_CHECKPOINT_DIR" 2>/dev/null
# The library hpcjob ships with the job (hpctorch), first, the task's own PYTHONPATH after it: trainers and
# data tasks import it alike, in any Python the job runs with.
export PYTHONPATH="$PWD/.hpcjob/lib${PYTHONPATH:+:$PYTHONPATH}"
[ -z "$HPCJOB_OUTPUT_DIR" ] || mkdir -p "$HPCJOB_OUTPUT_DIR" 2>/dev/null

hpcjob_exit() {
    local rc=$? first
    # A cancel sends SIGINT to every process of the task, again to each new one while the task stops:
    # ignored here, so are they in the commands below, which would otherwise die and lose the record.
    trap '' INT TERM HUP QUIT
    if [ "$rc" -ne 0 ]; then
        first=$(cat "$HPCJOB_EXIT_DIR"/rank-* 2>/dev/null | awk -v node="$HPCJOB_NODE" '$4 == node' | sort -n | head -n 1)
        [ -z "$first" ] || rc=$(echo "$first" | awk '{print $3}')
    fi
    echo "$rc $(date +%s.%N)" > "$HPCJOB_LOG_DIR/$HPCJOB_NODE.exit" 2>/dev/null
    exit "$rc"
}
trap hpcjob_exit EXIT
if [ -n "$HPCJOB_SECRETS_FILE" ]; then
    # Tracing off while the values are read (the test itself is traced, it holds none), back on after.
    case $- in *x*) hpcjob_trace=1; set +x ;; *) hpcjob_trace= ;; esac
    if [ ! -f "$HPCJOB_SECRETS_FILE" ] || [ ! -r "$HPCJOB_SECRETS_FILE" ]; then
        echo "hpcjob: the job's secrets file $HPCJOB_SECRETS_FILE is not there to read (removed when an attempt ends: submit the run again)" >&2
        exit 1
    fi
    # A line each, NAME=value, taken as it is: `export "NAME=value"` expands nothing in the value.
    while IFS= read -r hpcjob_line || [ -n "$hpcjob_line" ]; do
        case $hpcjob_line in
            [A-Za-z_]*=*) ;;
            *) continue ;;
        esac
        case ${hpcjob_line%%=*} in
            *[!A-Za-z0-9_]*) continue ;;
        esac
        export "$hpcjob_line"
    done < "$HPCJOB_SECRETS_FILE"
    unset hpcjob_line
    [ -z "$hpcjob_trace" ] || set -x
    unset hpcjob_trace
fi
# A job with --dataset: the command line calls this with the task's Python (and `data` on a data node) once
# the environment is there; it copies the sources onto this node's disk (.hpcjob/datasets.py), waits for the
# other nodes' copies, and names the task's folder of them; the copies it names stay on the node while this
# task's shell ($$, in the command substitution too) lives.
hpcjob_datasets() {
    HPCJOB_DATASETS=$("$1" .hpcjob/datasets.py "${2:-trainers}" $$) && export HPCJOB_DATASETS
}
# Where this node is on the job's network, in a person's words: the one that hosts the rendezvous says so.
if [ "$HPCJOB_IS_HOST" = 1 ]; then
    echo "hpcjob: $HPCJOB_NODE hosts the rendezvous, at $HPCJOB_ADDR ($HPCJOB_IFNAME)" >&2
else
    echo "hpcjob: $HPCJOB_NODE joins from $HPCJOB_ADDR ($HPCJOB_IFNAME)" >&2
fi
