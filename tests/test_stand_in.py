"""The emulator's light nodes (`--stand-in`, issue 42): each task's real node helper runs, then a stand-in
takes torchrun's place and does for the client what ranks do; a failing node is named by the client as a
real one is, a hung one is found by its beats, and a whole run of them ends with its metrics line. The
job XML and command lines are the client's own."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from hpcjob.backends.local import free_port
from hpcjob.emulator.standin import FAIL_VAR, HANG_VAR, stand_in_env

from .test_rest_e2e import emulated_cluster

pytestmark = pytest.mark.slow


def test_stand_in_nodes_run_the_real_node_helper_then_fail_or_finish_as_ranks_would(tmp_path: Path) -> None:
    nodes_env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
    env = stand_in_env(str(tmp_path / "stand-in"), nodes_env, seconds=6, fail="NODE002:3", line_s=1)
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('the stand-in runs instead of the script')\n")
    for cluster in emulated_cluster(tmp_path, env=env):
        job = ["submit", "--wait", "-n", "3", "--no-env", "--rdzv-port", str(free_port()),
               "--env", "HPCJOB_IFNAME=lo", "--hang-timeout", "5m"]  # fmt: skip
        failed = cluster.hpcjob(*job, "--run-id", "light-1", str(script))
        said = failed.stdout + failed.stderr
        assert failed.returncode == 3, said[-3000:]
        assert "NODE002" in said and "the stand-in of rank" in said  # named, with its own words
        logs = cluster.share_dir / "hpcjob" / "alice" / "train" / "logs" / "light-1"
        assert (logs / "NODE002.exit").read_text().split()[0] == "3"  # node.sh's exit record, the rank's code
        assert (logs / ".hpcjob-exits" / "rank-1").is_file()  # the worker shim's record of the rank
        assert list((logs / ".hpcjob-beats").glob("rank-*.json"))  # beats, as --hang-timeout asks
        assert "hpcjob: LOCALHOST hosts the rendezvous" in (logs / "LOCALHOST.err").read_text()  # node.sh ran

        del cluster.head.cluster.base_env[FAIL_VAR]
        finished = cluster.hpcjob(*job, "--run-id", "light-2", str(script))
        assert finished.returncode == 0, (finished.stdout + finished.stderr)[-3000:]
        out = (
            cluster.share_dir / "hpcjob" / "alice" / "train" / "logs" / "light-2" / "LOCALHOST.out"
        ).read_text()
        assert "stand-in of 1 rank(s) on LOCALHOST" in out and 'HPCJOB_METRICS {"stand_in": true' in out

        cluster.head.cluster.base_env[HANG_VAR] = "NODE003:1"  # in the run's first attempt
        hung = cluster.hpcjob(*job[:-2], "--hang-timeout", "10s", "--run-id", "light-3", str(script))
        said = hung.stdout + hung.stderr
        assert hung.returncode == 124, said[-3000:]  # ended as hung, by its beats
        assert "on NODE003 hung: stopped beating" in said
        assert re.search(r"while ranks 0, 1 waited in collective #\d+ nccl:all_reduce for \d+ s", said), said
