"""A task's processes start as the node agent starts them: default signals, stoppable at any moment."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from hpcjob.backends.local.procs import TaskProcess, exit_code, process_table


@pytest.mark.parametrize("delay_ms", range(0, 80, 8))
def test_a_sigint_at_any_moment_of_the_start_stops_the_task(delay_ms: int) -> None:
    """The start passes through a Python that resets the signals: a SIGINT caught there must not be
    lost at exec (the task would then run on until SIGKILL)."""
    task = TaskProcess(
        ["/bin/sleep", "30"],
        cwd="/",
        env=os.environ,
        marker=f"race-{delay_ms}-{os.getpid()}",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(delay_ms / 1000)
    os.kill(task.pid, signal.SIGINT)
    try:
        code = exit_code(task.popen.wait(timeout=5))
    finally:
        task.kill()
    assert code == 130


def test_a_task_starts_with_the_signals_its_starter_ignored_at_their_default() -> None:
    ignored = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # a background job under nohup
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in ignored}
    try:
        task = TaskProcess(
            ["/bin/sh", "-c", "grep -E '^Sig(Ign|Blk):' /proc/self/status"],
            cwd="/",
            env=os.environ,
            marker=f"ign-{os.getpid()}",
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert task.popen.stdout is not None
    shown = task.popen.stdout.read().decode()
    task.popen.wait()
    masks = dict(line.split(":\t") for line in shown.splitlines())
    assert int(masks["SigBlk"], 16) == 0  # nothing left blocked by the start
    assert int(masks["SigIgn"], 16) == 0  # nothing ignored, SIGPIPE included


def test_a_process_forked_after_the_sigint_gets_its_own() -> None:
    """A shell that starts its next command just after the SIGINT went out waits for that command: the
    command must be interrupted too, not left to run until the SIGKILL at the end of the grace period
    (the emulator once reported a canceled `sleep` task as killed, 137, for this reason)."""
    import sys
    import threading

    # Forks only once the SIGINT arrived: no list of processes taken at that moment can hold the child.
    late_fork = (
        "import signal, subprocess, sys\n"
        "signal.signal(signal.SIGINT, lambda *a: sys.exit(subprocess.call(['sleep', '30'])))\n"
        "print('ready', flush=True)\n"
        "signal.pause()\n"
    )
    task = TaskProcess(
        [sys.executable, "-c", late_fork],
        cwd="/",
        env=os.environ,
        marker=f"late-{os.getpid()}",
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert task.popen.stdout is not None
    assert task.popen.stdout.readline() == b"ready\n"
    started = time.monotonic()
    task.stop(grace_period=10.0, kill_now=threading.Event())
    took = time.monotonic() - started
    assert exit_code(task.popen.wait()) != 137
    assert took < 3, f"the late child waited for the SIGKILL ({took:.1f} s)"


def test_the_emulator_reads_the_process_table_once_a_tick_for_all_its_tasks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each tick, every running task learns its new descendants from one read of the process table and
    one map of it (issue 42: a 1,000-task job must leave the machine to the client being measured); each
    still finds its own grandchildren."""
    from hpcjob.backends.local import procs
    from hpcjob.emulator import agent

    tasks = [
        TaskProcess(["/bin/bash", "-c", "sleep 30 & wait"], cwd="/", env=os.environ,
                    marker=f"tick-{i}-{os.getpid()}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in range(4)
    ]  # fmt: skip
    try:
        time.sleep(0.3)  # each bash has started its sleep
        reads, maps = [], []
        real_table, real_children = procs.process_table, procs.children_of
        monkeypatch.setattr(agent, "process_table", lambda: reads.append(1) or real_table())
        monkeypatch.setattr(agent, "children_of", lambda table: maps.append(1) or real_children(table))
        agent.NodeAgent.refresh(tasks)
        assert (len(reads), len(maps)) == (1, 1)
        for task in tasks:
            assert len(task.live(deep=False)) == 2  # bash and its sleep
    finally:
        for task in tasks:
            task.kill()


def test_tasks_killed_together_share_their_reads_of_the_process_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tasks stopped at once (1,000 tasks ending together on the emulator) search /proc together: far
    fewer reads than tasks, and each still kills its own processes, grandchildren included."""
    from hpcjob.backends.local import procs

    reads = []

    def counted() -> procs.Snapshot:
        reads.append(1)
        time.sleep(0.05)  # a read of a big table takes a while: the others arrive meanwhile
        return procs.read_snapshot()

    monkeypatch.setattr(procs, "SHARED_READS", procs.SharedReads(counted))
    tasks = [
        TaskProcess(["/bin/bash", "-c", "sleep 30 & wait"], cwd="/", env=os.environ,
                    marker=f"together-{i}-{os.getpid()}", stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
        for i in range(12)
    ]  # fmt: skip
    time.sleep(0.3)
    found = [task.live() for task in tasks]
    assert all(len(live) == 2 for live in found)  # bash and its sleep, by the tree and the marker
    reads.clear()
    start = threading.Barrier(len(tasks))
    killers = [threading.Thread(target=lambda t=task: (start.wait(), t.kill())) for task in tasks]
    for killer in killers:
        killer.start()
    for killer in killers:
        killer.join()
    shared = len(reads)
    assert all(not task.live() for task in tasks)
    left = process_table([pid for live in found for pid, _ in live])
    assert all(state == b"Z" for _, _, state in left.values())  # gone, or a zombie not reaped yet
    assert shared <= len(tasks) / 2  # each kill reads at least twice: 24 without sharing
