"""Issue 33: a run's follower taken up again from the run history (`hpcjob wait`, Run.wait()), one at a
time under the run's lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from hpcjob.store.followers import FollowedElsewhere, follower_lock, lock_file

RUN = "train-1"


def test_a_killed_follower_leaves_no_lock_behind() -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import time\nfrom hpcjob.store.followers import follower_lock\n"
            f"with follower_lock({RUN!r}, 'hpcjob wait'):\n"
            "    print('held', flush=True)\n    time.sleep(60)\n"
        )],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        held = rf"\(process {holder.pid} on .*: hpcjob wait\)"
        with pytest.raises(FollowedElsewhere, match=held), follower_lock(RUN, "hpcjob wait"):
            pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        with follower_lock(RUN, "hpcjob wait"):  # the system let go of it
            assert json.loads(lock_file(RUN).read_text())["pid"] == os.getpid()
    finally:
        holder.kill()
        holder.wait()
