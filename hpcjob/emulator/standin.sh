#!/bin/bash
# hpcjob emulator's stand-in for torchrun and the training script (python -m hpcjob.emulator --stand-in):
# what a node's ranks do for hpcjob's client, in one bash process per node, after the task's real
# node.sh has run. The emulator's `python3` on the nodes runs this for `python3 -m torch.distributed.run
# ...` and the real Python for anything else (the node files, the environment).
#
# Each rank of the node (--nproc_per_node; its global rank: the task's number - 1, times that, plus the
# local rank) beats where the job asks (HPCJOB_BEAT_S, HPCJOB_BEAT_DIR: rank-<RANK>.json as worker.py
# writes it); local rank 0 says a step line every HPCJOB_STANDIN_LINE_S seconds and appends the node's
# metrics over time (metrics/<NODE>-0.jsonl, as hpctorch does); after HPCJOB_STANDIN_SECONDS the node
# ends, the first node's rank 0 printing the run's HPCJOB_METRICS line. HPCJOB_STANDIN_FAIL=NODE:CODE:
# that node's rank fails halfway, recording its exit (the worker shim's record) and ending with CODE;
# HPCJOB_STANDIN_HANG=NODE[:ATTEMPT]: that node (in that attempt of the run only, HPCJOB_ATTEMPT, where
# given) stops beating and saying anything halfway, and waits to be killed,
# having written when it stopped ($HPCJOB_LOG_DIR/.standin-hung); the others, once they see that file, wait
# until killed in the next all-reduce (their beats say so: in flight, the sequence still), as ranks blocked
# by a hung peer do.
# No training, no torch, no GPU, no rendezvous: it stands for none of that.
nproc=1
for arg in "$@"; do
    case $arg in
        --nproc_per_node=*|--nproc-per-node=*) nproc=${arg#*=} ;;
    esac
done
case $nproc in ''|*[!0-9]*) nproc=1 ;; esac
node=${HPCJOB_NODE:-$(hostname)}
first=$(( (${CCP_TASKID:-1} - 1) * nproc ))
seconds=${HPCJOB_STANDIN_SECONDS:-60}
line_every=${HPCJOB_STANDIN_LINE_S:-2}
beat_every=${HPCJOB_BEAT_S:-0}
metrics_every=10
half=$(( seconds / 2 ))
fail=
code=0
if [ "${HPCJOB_STANDIN_FAIL%%:*}" = "$node" ]; then fail=1; code=${HPCJOB_STANDIN_FAIL#*:}; fi
hang=
case ${HPCJOB_STANDIN_HANG:-} in
    "$node"|"$node:${HPCJOB_ATTEMPT:-1}") hang=1 ;;
esac
exec {wait_fd}<> <(:)  # `read -t` on a pipe nobody writes: a sleep without a process
start=${EPOCHREALTIME%.*}
step=0
blocked=
hung_file=$HPCJOB_LOG_DIR/.standin-hung
next_line=0
next_beat=0
next_metrics=0
mkdir -p "$HPCJOB_LOG_DIR/metrics" 2>/dev/null
[ -z "$HPCJOB_BEAT_DIR" ] || [ "$beat_every" = 0 ] || mkdir -p "$HPCJOB_BEAT_DIR" 2>/dev/null
while :; do
    now=${EPOCHREALTIME/,/.}
    elapsed=$(( ${now%.*} - start ))
    # A node hung: the others wait, beating, in the all-reduce after its last (the same for all), until killed.
    if [ -z "$blocked" ] && [ -e "$hung_file" ] && read -r hung_at _ < "$hung_file"; then
        blocked=$(( ${hung_at%.*} + 1 ))
    fi
    if [ "$elapsed" -ge "$seconds" ] && [ -z "$blocked" ]; then break; fi
    if [ "$elapsed" -ge "$half" ]; then
        if [ -n "$fail" ]; then
            echo "RuntimeError: the stand-in of rank $first on $node fails (HPCJOB_STANDIN_FAIL)" >&2
            [ -z "$HPCJOB_EXIT_DIR" ] || { mkdir -p "$HPCJOB_EXIT_DIR" && echo "$now $first $code $node -" > "$HPCJOB_EXIT_DIR/rank-$first"; } 2>/dev/null
            exit "$code"
        fi
        if [ -n "$hang" ]; then
            echo "$now $node" > "$hung_file"
            while :; do read -r -t 3600 -u "$wait_fd"; done
        fi
    fi
    [ -n "$blocked" ] || step=$(( step + 1 ))
    if [ -z "$blocked" ] && [ "$elapsed" -ge "$next_line" ]; then
        echo "epoch 1 step $step loss 1.000 (stand-in of $nproc rank(s) on $node)"
        next_line=$(( elapsed + line_every ))
    fi
    if [ "$beat_every" != 0 ] && [ -n "$HPCJOB_BEAT_DIR" ] && [ "$elapsed" -ge "$next_beat" ]; then
        # A collective a second (its number: the clock's second, the same on every node), as worker.py
        # writes it (seq, name, began, state, in flight); once a node hangs, the next never ends.
        seq=${now%.*} flight=false state=completed
        [ -z "$blocked" ] || { seq=$blocked flight=true state=scheduled; }
        for (( local = 0; local < nproc; local++ )); do
            printf '{"t": %s, "rank": %d, "node": "%s", "pid": %d, "collectives": {"0": [%d, "nccl:all_reduce", %d, "%s", %s]}}' \
                "$now" $(( first + local )) "$node" "$$" "$seq" "$seq" "$state" "$flight" \
                > "$HPCJOB_BEAT_DIR/rank-$(( first + local )).json" 2>/dev/null
        done
        next_beat=$(( elapsed + ${beat_every%.*} ))
    fi
    if [ -z "$blocked" ] && [ "$elapsed" -ge "$next_metrics" ]; then
        printf '{"t": %s, "event": "step", "rank": %d, "node": "%s", "epoch": 1, "step": %d}\n' \
            "$now" "$first" "$node" "$step" >> "$HPCJOB_LOG_DIR/metrics/$node-0.jsonl" 2>/dev/null
        next_metrics=$(( elapsed + metrics_every ))
    fi
    read -r -t 1 -u "$wait_fd"
done
if [ "$first" = 0 ]; then
    echo "HPCJOB_METRICS {\"stand_in\": true, \"epochs_completed\": 1, \"steps\": $step}"
fi
exit 0
