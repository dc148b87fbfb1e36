#!/bin/bash
# hpcjob's execution filter, installed as OnJobTaskStart.sh and as OnTaskStart.sh (the work is in
# hpcjob_mount_filter.py beside it). HPC Pack's Linux node agent runs OnJobTaskStart.sh as root at the
# first task of a job on this node and OnTaskStart.sh at the job's later tasks here, with the task start
# as JSON on stdin, and reads stdout and stderr together as the JSON it goes on with. So nothing but that
# JSON leaves this script, and whatever goes wrong (no python3, one older than 3.6, a crash, a hang past
# 20 s, above the filter's own bound of 15 s, 20 at most) the start passes on unchanged, and the
# filter's log says why. A filter that was here before hpcjob's was installed runs after it, on what
# it printed.
# Nothing of this script's own reaches stderr, which the agent reads with stdout as the JSON (bash's
# "write error: Broken pipe", where the agent's SIGPIPE is ignored, among others); a chained filter
# keeps its stderr. The system's PATH, not the agent's (a folder on that which others may write would
# run as root); an emulated node (hpcjob.emulator, HPCJOB_NODE_ROOT) keeps the test's.
exec 3>&2 2>/dev/null
[ -n "$HPCJOB_NODE_ROOT" ] || PATH=/usr/sbin:/usr/bin:/sbin:/bin
here=$(cd "$(dirname "$0")" && pwd)
name=$(basename "$0" .sh)
case $name in OnJobTaskStart) event=job-task-start ;; *) event=task-start ;; esac
log=$HPCJOB_NODE_ROOT/var/log/hpcjob/mount-filter.log
start=$(cat)
out=
python=
# platform-python: the 3.6 of RHEL 8, where python3 is not installed by default.
# One older than 3.6 fails on the filter's syntax, and the start passes on unchanged as below.
for candidate in python3 /usr/libexec/platform-python; do
    if command -v "$candidate" >/dev/null 2>&1; then
        python=$candidate
        break
    fi
done
code=
if [ -n "$python" ]; then
    out=$(printf '%s' "$start" | timeout -k 2 20 "$python" -I "$here/hpcjob_mount_filter.py" "$event")
    code=$?
    # The administrator's container policy (a "containers" entry in the allowed shares' file) fails
    # closed: a start it refused, or one that may name a container when the policy could not be
    # applied, fails, and the agent tells the task these words.
    if [ "$code" = 3 ]; then
        printf '%s\n' "$out"
        exit 1
    fi
    [ "$code" = 0 ] || out=
fi
if [ -z "$out" ] && grep -qF '"containers"' "$here/hpcjob-mounts.json" && [[ $start == *CCP_DOCKER_* ]]; then
    echo "hpcjob's execution filter could not apply the administrator's container policy (${python:-no python3}): the task is refused"
    (umask 077 && mkdir -p "${log%/*}" &&
        echo "$(date +%Y-%m-%dT%H:%M:%S) $name: ${python:-no python3} failed: a container start refused" >>"$log")
    exit 1
fi
if [ -z "$out" ]; then
    why=${python:+"$python $here/hpcjob_mount_filter.py failed"}
    (umask 077 && mkdir -p "${log%/*}" &&
        echo "$(date +%Y-%m-%dT%H:%M:%S) $name: ${why:-no python3}: the start passed on unchanged" >>"$log")
    out=$start
fi
if [ -x "$here/$name.hpcjob-next.sh" ]; then
    printf '%s' "$out" | "$here/$name.hpcjob-next.sh" 2>&3
else
    printf '%s' "$out"
fi
