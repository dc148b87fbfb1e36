"""A failing script shows its own error first: the echo of the nodes' output cuts each traceback to the
script's frames, shows it once, and leaves torchrun's report out; the logs keep everything.

tests/captured/ holds real stderr of `hpcjob run --local` tasks (Python 3.11, torch 2.14; only the
share's and the virtual environment's paths rewritten): a script failing at import, before it has a
process group (Python's own format), and failing at a step (each line after torch's `[rankN]: `), on two
nodes; and one raising a chained exception from a module of its own, two ranks on one node.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcjob.job.tracebacks import CHAIN, HEADER, TracebackFilter, filter_output
from hpcjob.store.logs import reason_line
from hpcjob.store.share import LocalFolder

CAPTURED = Path(__file__).resolve().parent / "captured"


def captured(name: str, node: str) -> list[tuple[str, str, str]]:
    return [(node, "stderr", line) for line in (CAPTURED / name).read_text().splitlines()]


def shown_text(shown: list[tuple[str, str, str]]) -> list[str]:
    return [f"[{node}] {line}" for node, _, line in shown]


def test_a_script_failing_at_import_on_two_nodes_shows_its_traceback_once() -> None:
    shown = shown_text(
        filter_output(captured("import-LOCAL1.err", "LOCAL1") + captured("import-LOCAL2.err", "LOCAL2"))
    )
    assert shown == [
        "[LOCAL1] hpcjob: LOCAL1 hosts the rendezvous, at 127.0.0.1 (lo)",
        "[LOCAL1] Traceback (most recent call last):",
        '[LOCAL1]   File "raise_at_import.py", line 1, in <module>',
        "[LOCAL1]     import nonexistent_module_xyz",
        "[LOCAL1] ModuleNotFoundError: No module named 'nonexistent_module_xyz'",
        "[LOCAL2] hpcjob: LOCAL2 joins from 127.0.0.1 (lo)",
        "[LOCAL2] (the same traceback as above, from LOCAL1)",
    ]


def test_a_script_failing_at_a_step_shows_its_own_frames_after_its_rank() -> None:
    shown = shown_text(
        filter_output(captured("step-LOCAL1.err", "LOCAL1") + captured("step-LOCAL2.err", "LOCAL2"))
    )
    assert shown == [
        "[LOCAL1] hpcjob: LOCAL1 hosts the rendezvous, at 127.0.0.1 (lo)",
        "[LOCAL1] [rank0]: Traceback (most recent call last):",
        '[LOCAL1] [rank0]:   File "raise_in_step.py", line 15, in <module>',
        "[LOCAL1] [rank0]:     main()",
        '[LOCAL1] [rank0]:   File "raise_in_step.py", line 12, in main',
        "[LOCAL1] [rank0]:     step(i)",
        '[LOCAL1] [rank0]:   File "raise_in_step.py", line 5, in step',
        '[LOCAL1] [rank0]:     raise RuntimeError(f"boom at step {i}")',
        "[LOCAL1] [rank0]: RuntimeError: boom at step 1",
        "[LOCAL2] hpcjob: LOCAL2 joins from 127.0.0.1 (lo)",
        "[LOCAL2] [rank1]: (the same traceback as above, from rank 0 on LOCAL1)",
    ]


def test_a_chained_exception_keeps_both_parts_and_the_script_s_modules() -> None:
    shown = [line for _, _, line in filter_output(captured("chained-LOCAL1.err", "LOCAL1"))]
    helper = (
        '[rank1]:   File "/home/ada/.local/share/hpcjob/local-share/code-5f1c2e7a/hpcjob/chained/helper.py"'
    )
    start = shown.index("[rank1]: Traceback (most recent call last):")
    assert shown[start:] == [
        "[rank1]: Traceback (most recent call last):",
        f"{helper}, line 3, in lookup",
        "[rank1]:     return table[key]",
        "[rank1]:            ~~~~~^^^^^",
        "[rank1]: KeyError: 'lr'",
        "",
        "[rank1]: The above exception was the direct cause of the following exception:",
        "",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "chained.py", line 6, in <module>',
        '[rank1]:     print(lookup(settings, "lr") * 2)',
        "[rank1]:           ^^^^^^^^^^^^^^^^^^^^^^",
        f"{helper}, line 5, in lookup",
        '[rank1]:     raise RuntimeError(f"no {key!r} in the table") from exc',
        "[rank1]: RuntimeError: no 'lr' in the table",
        "[rank0]: (the same traceback as above, from rank 1 on LOCAL1)",
        "W1127 06:38:20.983000 5487 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process "
        "6446 closing signal SIGTERM",
    ]


def test_torchrun_s_report_is_left_out_and_everything_else_kept() -> None:
    lines = captured("step-LOCAL1.err", "LOCAL1")
    shown = [line for _, _, line in filter_output(lines)]
    assert not [line for line in shown if "worker.py" in line or "ChildFailedError" in line]
    assert not [line for line in shown if "Root Cause" in line or "failed (exitcode" in line]
    assert not [line for line in shown if "frozen runpy" in line or "=====" in line]
    assert len(shown) == 9  # of 52: the node's own line, and the script's traceback


def test_different_tracebacks_are_each_shown() -> None:
    one = ["Traceback (most recent call last):", '  File "t.py", line 2, in <module>', "ValueError: 1"]
    two = [*one[:2], "ValueError: 2"]
    shown = filter_output([("A", "stderr", line) for line in one] + [("B", "stderr", line) for line in two])
    assert [line for _, _, line in shown] == [*one, *two]


def test_a_traceback_of_hidden_frames_alone_is_shown_whole() -> None:
    """hpcjob's shim failing itself (the script missing): nothing of the script's to show instead."""
    lines = [
        "Traceback (most recent call last):",
        '  File "/share/job/.hpcjob/worker.py", line 297, in _run',
        '    runpy.run_path(script, run_name="__main__")',
        '  File "<frozen runpy>", line 286, in run_path',
        "FileNotFoundError: [Errno 2] No such file or directory: 'gone.py'",
    ]
    assert [line for _, _, line in filter_output([("A", "stderr", line) for line in lines])] == lines


def test_what_does_not_read_as_a_traceback_is_shown_as_it_came() -> None:
    """Two ranks' lines mixed, a traceback cut off at the end, an exception group: nothing is lost."""
    mixed = [
        "Traceback (most recent call last):",
        '  File "/share/job/.hpcjob/worker.py", line 367, in <module>',
        "Traceback (most recent call last):",
        '  File "t.py", line 1, in <module>',
        "hpcjob: the line of another process",
    ]
    assert [line for _, _, line in filter_output([("A", "stderr", line) for line in mixed])] == mixed
    group = ["  + Exception Group Traceback (most recent call last):", '  |   File "t.py", line 1']
    assert [line for _, _, line in filter_output([("A", "stderr", line) for line in group])] == group


def test_a_traceback_is_held_until_it_ends_however_it_comes() -> None:
    lines = captured("import-LOCAL1.err", "LOCAL1")
    whole = filter_output(lines)
    tracebacks = TracebackFilter()
    shown = []
    for index, line in enumerate(lines):
        fed = tracebacks.feed(*line)
        if 1 <= index < 14:  # within the traceback: nothing yet
            assert fed == []
        shown += fed
        if index % 5 == 0:  # the end of a look
            shown += tracebacks.flush()
    assert shown + tracebacks.flush(final=True) == whole


# Lines of tracebacks, chains and torchrun's box, with or without a rank's prefix, and any text.
PIECES = [
    HEADER,
    *CHAIN,
    "",
    '  File "t.py", line 1, in <module>',
    '  File "/j/.hpcjob/worker.py", line 3, in main',
    '  File "<frozen runpy>", line 88, in _run_code',
    "    main()",
    "    ^^^^^^",
    "ValueError: x",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "=" * 60,
    "Root Cause (first observed failure):",
    "E1 api.py torch/distributed/elastic/multiprocessing/api.py:1] failed (exitcode: 1) local_rank: 0",
]
LINES = st.lists(
    st.tuples(
        st.sampled_from(["A", "B"]),
        st.sampled_from(["", "[rank0]: ", "[rank1]: "]),
        st.one_of(st.sampled_from(PIECES), st.text(st.characters(exclude_characters="\n\r"), max_size=8)),
        st.booleans(),  # a look ends after the line
    ),
    max_size=60,
)


@given(lines=LINES)
def test_the_echo_only_leaves_out_or_names_what_it_was_given(lines: list[tuple[str, str, str, bool]]) -> None:
    tracebacks = TracebackFilter()
    shown = []
    for node, prefix, text, look_ends in lines:
        shown += tracebacks.feed(node, "stderr", prefix + text if text else "")
        if look_ends:
            shown += tracebacks.flush()
    shown += tracebacks.flush(final=True)
    given_lines = {(node, prefix + text if text else "") for node, prefix, text, _ in lines}
    for node, _, line in shown:
        assert (node, line) in given_lines or "(the same traceback as above, from " in line
    plain = [(node, "stderr", prefix + text if text else "") for node, prefix, text, _ in lines]
    if not any(HEADER in line or "exitcode" in line for _, _, line in plain):
        assert shown == plain


def test_the_first_failure_names_the_script_s_exception_after_its_rank(tmp_path: Path) -> None:
    """torch's `[rankN]: ` before the exception, and torchrun's box after it: the exception still."""
    (tmp_path / "LOCAL1.err").write_text((CAPTURED / "chained-LOCAL1.err").read_text())
    assert reason_line(LocalFolder(tmp_path), "", "LOCAL1", 1) == "RuntimeError: no 'lr' in the table"
    text = (CAPTURED / "chained-LOCAL1.err").read_text().replace("[rank0]: RuntimeError", "[rank0]: OSError")
    (tmp_path / "LOCAL1.err").write_text(text)
    assert reason_line(LocalFolder(tmp_path), "", "LOCAL1", 1) == "RuntimeError: no 'lr' in the table"
    assert reason_line(LocalFolder(tmp_path), "", "LOCAL1", 0) == "OSError: no 'lr' in the table"


IMPORT_FAILS = "import nonexistent_module_xyz\n"
STEP_FAILS = """\
import torch.distributed as dist


def step(i):
    raise RuntimeError(f"boom at step {i}")


dist.init_process_group("gloo")
for i in range(3):
    if i == 1:
        step(i)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "frames"),
    [
        (IMPORT_FAILS, ['File "fails.py", line 1, in <module>', "import nonexistent_module_xyz"]),
        (STEP_FAILS, ['File "fails.py", line 11, in <module>', 'File "fails.py", line 5, in step']),
    ],
    ids=["at-import", "at-a-step"],
)
def test_two_local_nodes_show_the_script_s_error_first(
    tmp_path: Path, source: str, frames: list[str]
) -> None:
    script = tmp_path / "code" / "fails.py"
    script.parent.mkdir()
    script.write_text(source)
    share = tmp_path / "share"
    # A run id of each case's own: the two run at once under xdist, and a local run stops its nodes by a
    # marker made of its run id (hpcjob.backends.local.procs).
    run_id = "fails-import" if source == IMPORT_FAILS else "fails-step"
    command = [sys.executable, "-m", "hpcjob.cli", "run", "--local", "-n", "2", "--grace-period", "5"]
    result = subprocess.run(
        [*command, "--mount-point", str(share), "--run-id", run_id, str(script)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    said = result.stdout + result.stderr
    assert result.returncode == 1, said
    for frame in frames:
        assert frame in said
    assert said.count("Traceback (most recent call last):") == 1, said
    assert "worker.py" not in said and "frozen runpy" not in said and "ChildFailedError" not in said
    first = [line for line in said.splitlines() if line.startswith("  first failure: rank ")]
    error = (
        "ModuleNotFoundError: No module named" if source == IMPORT_FAILS else "RuntimeError: boom at step 1"
    )
    assert len(first) == 1 and error in first[0], said
    # The logs keep everything: each node's stderr has the whole trace, and torchrun's report.
    logs = share / "hpcjob" / "fails" / "logs" / run_id
    summary = json.loads((logs / "summary.json").read_text())
    failed = summary["root_cause"]["node"]
    err = (logs / f"{failed}.err").read_text()
    assert ".hpcjob/worker.py" in err and "<frozen runpy>" in err and "ChildFailedError" in err
    assert all(frame in err for frame in frames)
    # Both ranks fail at once; the node stopped first may go before its rank said why.
    said_twice = all(
        "Traceback (most recent" in (logs / f"{n}.err").read_text() for n in ("LOCAL1", "LOCAL2")
    )
    assert ("(the same traceback as above, from " in said) == said_twice, said


# What a node prints as hpcjob stops it (torch 2.14.1, seen here): its rank's KeyboardInterrupt, torchrun's
# warnings, an atexit error and torchrun's own SignalException traceback.
STOPPED = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "fail.py", line 6, in <module>
[rank0]:     time.sleep(60)
[rank0]: KeyboardInterrupt
W1129 02:52:29.734000 14847 torch/distributed/elastic/agent/server/api.py:753] Received 2 death signal, shutting down workers
Exception ignored in atexit callback: <function shutdown at 0x7f3205d549a0>
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1142, in <module>
    main()
torch.distributed.elastic.multiprocessing.api.SignalException: Process 14847 got signal: 2
"""  # noqa: E501


def test_what_hpcjob_s_stop_makes_the_other_nodes_print_is_one_line() -> None:
    tracebacks = TracebackFilter()
    shown = tracebacks.feed("LOCAL2", "stderr", "[rank1]: RuntimeError: boom")
    shown += tracebacks.feed("LOCAL1", "stderr", "[rank0]: Traceback (most recent call last):")  # held
    tracebacks.stopping(["LOCAL1", "LOCAL3"])
    for node in ("LOCAL1", "LOCAL3"):
        for line in STOPPED.splitlines():
            shown += tracebacks.feed(node, "stderr", line)
    shown += tracebacks.feed("LOCAL2", "stderr", "[rank1]: still said")  # a node not stopped: all of it
    shown += tracebacks.flush(final=True)
    assert shown == [
        ("LOCAL2", "stderr", "[rank1]: RuntimeError: boom"),
        ("LOCAL2", "stderr", "[rank1]: still said"),
        (
            "LOCAL1, LOCAL3",
            "stderr",
            "stopped by hpcjob: 21 line(s) printed as they stopped, left out (`hpcjob logs` has them)",
        ),
    ]
    assert tracebacks.flush(final=True) == []  # said once


# What torch 2.14 printed on LOCAL2 when rank 1 on LOCAL1, the rendezvous host, raised (CI, a loaded
# machine: before hpcjob stopped LOCAL2), cut short.
STORE_LOST = """\
[W1129 06:07:15.265500044 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on SocketImpl(fd=3, addr=[::ffff:127.0.0.1]:39856, remote=[::ffff:127.0.0.1]:20240): Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?
Exception raised from recvBytes at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/Utils.hpp:790 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7f9dc3f5e60d in libc10.so)
<omitting python frames>

W1129 06:07:15.528000 3286 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 3355 closing signal SIGTERM
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 114, in _call_store
    return getattr(self._store, store_op)(*args, **kwargs)
torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?
"""  # noqa: E501


def test_what_a_failed_rendezvous_host_makes_the_other_nodes_print_is_one_line() -> None:
    """Rank 1 on LOCAL1 fails and takes the rendezvous store with it: what LOCAL2 prints of the lost store,
    even before hpcjob stops it, is folded with what the stop makes it print. Without a failure shown
    first, a lost store is news, and shown."""
    tracebacks = TracebackFilter()
    shown: list[tuple[str, str, str]] = []
    failed = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "fail.py", line 6, in <module>',
        "[rank1]:     raise RuntimeError('boom from rank 1')",
        "[rank1]: RuntimeError: boom from rank 1",
    ]
    for line in failed:
        shown += tracebacks.feed("LOCAL1", "stderr", line)
    shown += tracebacks.feed("LOCAL2", "stdout", "epoch 1")  # before the loss: as it came
    for line in STORE_LOST.splitlines():
        shown += tracebacks.feed("LOCAL2", "stderr", line)
    tracebacks.stopping(["LOCAL2"])  # hpcjob's stop, after
    shown += tracebacks.flush(final=True)
    told = [line for node, _, line in shown if node == "LOCAL1"]
    assert told[-1] == "[rank1]: RuntimeError: boom from rank 1"
    assert [(node, line) for node, _, line in shown if node != "LOCAL1"] == [
        ("LOCAL2", "epoch 1"),
        (
            "LOCAL2",
            "stopped by hpcjob: 10 line(s) printed as they stopped, left out (`hpcjob logs` has them)",
        ),
    ]
    alone = TracebackFilter()
    first = STORE_LOST.splitlines()[0]
    assert alone.feed("LOCAL2", "stderr", first) == [("LOCAL2", "stderr", first)]


@pytest.mark.slow
def test_a_failing_rank_and_a_ctrl_c_are_told_in_a_few_lines(tmp_path: Path) -> None:
    """A 2-node run whose rank 1 raises after init_process_group: at most 25 lines, the user's error
    first (58 before, 44 of them the other node's stop); Ctrl-C of a 2-node run: at most 15."""
    import os
    import signal
    import time

    script = tmp_path / "code" / "fail.py"
    script.parent.mkdir()
    script.write_text(
        "import os, sys, time\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "print('ready', flush=True)\n"
        "if dist.get_rank() == 1 and os.environ.get('FAIL'):\n    raise RuntimeError('boom from rank 1')\n"
        "time.sleep(120)\n"
    )
    run = [sys.executable, "-m", "hpcjob.cli", "run", "--local", "-n", "2", "--mount-point", str(tmp_path)]
    failed = subprocess.run(
        [*run, "--grace-period", "5", str(script)], capture_output=True, text=True, timeout=240,
        env={**os.environ, "FAIL": "1"},
    )  # fmt: skip
    lines = (failed.stdout + failed.stderr).splitlines()
    assert failed.returncode == 1 and len(lines) <= 25, "\n".join(lines)
    errors = [line for line in lines if "[rank" in line]
    assert errors[0].endswith("[rank1]: Traceback (most recent call last):")
    assert "KeyboardInterrupt" not in "\n".join(lines) and "SignalException" not in "\n".join(lines)
    assert any("stopped by hpcjob: " in line for line in lines)

    interrupted = subprocess.Popen(
        [*run, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    said: list[str] = []
    assert interrupted.stdout is not None
    deadline = time.monotonic() + 180
    while sum("ready" in line for line in said) < 2 and time.monotonic() < deadline:
        said.append(interrupted.stdout.readline())
    interrupted.send_signal(signal.SIGINT)
    rest, _ = interrupted.communicate(timeout=120)
    lines = "".join(said).splitlines() + rest.splitlines()
    assert interrupted.returncode == 130 and len(lines) <= 15, "\n".join(lines)
