#!/bin/bash
# HPC Pack's Linux node agent runs this as root at each task start, with the task as JSON on stdin, and
# goes on with the JSON it prints. hpcjob's filter mounts the share a job names (HPCJOB_MOUNT); a filter
# that was here before hpcjob's was installed runs after it, on what it printed.
set -o pipefail
here=$(dirname "$0")
if [ -x "$here/OnJobTaskStart.hpcjob-next.sh" ]; then
    python3 "$here/hpcjob_mount_filter.py" | "$here/OnJobTaskStart.hpcjob-next.sh"
else
    exec python3 "$here/hpcjob_mount_filter.py"
fi
