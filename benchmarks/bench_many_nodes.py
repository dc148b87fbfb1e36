"""What hpcjob costs the client and the head node as a job's nodes grow (issue 42), by simulation.

The local head node (hpcjob.emulator, in a process of its own) with N + 2 nodes whose ranks are stand-ins
(`--stand-in`: each task's real node.sh runs, then one bash process per node does what its ranks do for
the client: lines, beats with their collectives, metrics, an exit record). For each size N, this process
is the client: it submits a run of N nodes through the REST API (`hpcjob.submit`, the profile's local
folder standing in for the share, no mount step, one retry) and follows it (`Run.wait`) through the
scenarios in turn:
1. following for --follow seconds once every node runs, counting what the client asks meanwhile: REST
   requests (at requests.Session), share calls and bytes (at hpcjob.store.share, counting_share_calls),
   the polls (RestClient.job_with_tasks), and with the share over smbd, SMB round trips (at
   smbprotocol's Connection); the client's CPU and the emulator's, a node's memory (PSS);
2. a node lost (the emulator's `lose NODE`), noticed by the head node after 5 s: how long from then to the
   client seeing the attempt's job failed (its poll), from that to the second attempt submitted (the
   client's work: the summary, the cause, the nodes, the job), and to its first and last node running
   (one of them the spare; the last is this machine starting N node helpers);
3. a node that hangs halfway through the second attempt (the others then block, as real ranks would):
   how long from its stop until the client names it, from the beats (--hang-timeout: half of --follow,
   10 s at least).
Then the summary and root cause read from the share; a job of N nodes of which one fails halfway (how
long from that node's end to the client naming it); the sizes of --smb-sizes once more with the share
served by a real smbd (the test bed's); the run history of --runs runs, and the time of `runs --last
20`, `runs show`, all of them and `runs --json` (whole commands, each its own process: the command
line's start included).

    .venv/bin/python benchmarks/bench_many_nodes.py [--sizes 16,128,1000] [--follow 120] [--runs 10000]
    .venv/bin/python benchmarks/bench_many_nodes.py --sizes 16,128 --follow 20 --runs 1000  # a few minutes

Prints a table, then one JSON line per size with at least nodes, requests_per_poll,
share_reads_per_poll, client_cpu_s_per_min, peak_rss_mb, summary_s, runs_10k_s, and the emulator's own
CPU beside the client's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hpcjob.backends.local import free_port  # noqa: E402
from hpcjob.cli.tables import table  # noqa: E402
from hpcjob.store.share import counting_share_calls  # noqa: E402

PASSWORD = "bench-Pw-1"
GPU = ["ComputeNodes", "LinuxNodes", "GPUNodes"]
TICKS = os.sysconf("SC_CLK_TCK")
DETECTION_S = 5.0  # how long the head node takes to notice a lost node (--detection-delay)
LOST, HUNG = "NODE0002", "NODE0001"  # the node lost in the first attempt, the one that hangs in the second


class Counts:
    """What the client asked, since `reset`: REST requests and polls (each a look at the job's state);
    the share's calls are hpcjob.store.share.counting_share_calls's."""

    def __init__(self) -> None:
        self.requests = 0
        self.polls = 0

    def reset(self) -> None:
        self.requests = self.polls = 0


def instrument() -> Counts:
    """Count at hpcjob's own interfaces: every REST request, every look at the job's state."""
    import requests

    from hpcjob.backends.rest import RestClient

    counts = Counts()
    request, job_with_tasks = requests.Session.request, RestClient.job_with_tasks

    def counted_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts.requests += 1
        return request(self, *args, **kwargs)

    def counted_poll(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts.polls += 1
        return job_with_tasks(self, *args, **kwargs)

    requests.Session.request = counted_request  # type: ignore[method-assign]
    RestClient.job_with_tasks = counted_poll  # type: ignore[method-assign]
    return counts


def cpu_s(pid: int) -> float:
    """A process's own CPU time (user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def node_memory_mb(node: str) -> float:
    """The proportional memory (PSS) of one node's task processes, by the node in their CCP_NODES."""
    from hpcjob.backends.local.procs import marked_processes

    total = 0
    for pid, _ in marked_processes(f"CCP_NODES=1 {node} ".encode()):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
    return total / 1024


class Head:
    """The emulator in its process: its URL, CA file and pid; `command` says a line on its stdin
    (--stdin-commands) and returns its answer."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None and process.stdin is not None
        self.process, self.pid = process, process.pid
        self.url, self.ca_file = process.stdout.readline().strip(), process.stdout.readline().strip()
        self._answers: list[str] = []
        self._said = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._said:
                self._answers.append(line.strip())
                self._said.notify_all()

    def command(self, line: str) -> str:
        assert self.process.stdin is not None
        with self._said:
            self._answers.clear()
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
            self._said.wait_for(lambda: any(a.startswith(("ok:", "error:")) for a in self._answers), 30)
            return next((a for a in self._answers if a.startswith(("ok:", "error:"))), "no answer")


@contextlib.contextmanager
def emulator(nodes: int, share: Path, seconds: float, folder: Path, *stand_in: str) -> Iterator[Head]:
    """The head node in a process of its own, with `nodes` + 2 stand-in nodes (`stand_in`: more options,
    --stand-in-fail NODE:CODE, --stand-in-hang NODE[:ATTEMPT]), lost nodes noticed after DETECTION_S."""
    spec = [{"Name": f"NODE{i:04d}", "Cores": 4, "Groups": GPU} for i in range(1, nodes + 3)]
    nodes_file = folder / "nodes.json"
    nodes_file.write_text(json.dumps(spec))
    command = [sys.executable, "-m", "hpcjob.emulator", "--user", "alice", "--nodes-file", str(nodes_file),
               "--share-dir", str(share), "--grace-period", "1", "--command-line-limit", "0",
               "--detection-delay", str(DETECTION_S), "--stdin-commands", "--stand-in", str(seconds),
               *stand_in]  # fmt: skip
    env = {**os.environ, "HPCJOB_EMULATOR_PASSWORD": PASSWORD}
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=env)  # fmt: skip
    try:
        yield Head(process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


@contextlib.contextmanager
def share_folder(folder: Path, smb: bool) -> Iterator[tuple[Path, list[str], dict[str, str]]]:
    """The share (the emulator's --share-dir), the profile's options to reach it and the environment
    it needs: a local folder, or with `smb` the same folder served by a real smbd (the test bed's)."""
    share = folder / "CcpSpoolDir" / "app"
    share.mkdir(parents=True)
    if not smb:
        yield share, ["--share", "//HEADNODE/CcpSpoolDir", "--local-share", str(share)], {}
        return
    from tests.testbed import SmbServer

    with SmbServer(share) as server:
        options = ["--share", server.folder_unc, "--smb-user", server.username, "--smb-server",
                   server.address, "--smb-port", str(server.port)]  # fmt: skip
        yield share, options, {"HPCJOB_SMB_PASSWORD": server.password}


def profile(folder: Path, share: Path, head: Head, reach: list[str], env: dict[str, str]) -> None:
    """The cluster `emu` in this benchmark's own config: the nodes see the share at its own path."""
    os.environ.update(
        HPCJOB_CONFIG=str(folder / "clusters.toml"), BENCH_PW=PASSWORD, XDG_STATE_HOME=str(folder / "state"),
        **env,
    )  # fmt: skip
    add = [sys.executable, "-m", "hpcjob.cli", "cluster", "add", "emu", "--url", head.url, "--user",
           "alice", "--password-env", "BENCH_PW", "--ca-bundle", head.ca_file, *reach,
           "--mount-point", str(share), "--node-group", "GPUNodes", "--poll-interval", "5"]  # fmt: skip
    subprocess.run(add, check=True, capture_output=True)


def smb_round_trips() -> list[int]:
    """Count every SMB request message sent (a compound of several is one round trip)."""
    from smbprotocol.connection import Connection

    sent = [0]
    send, compound = Connection.send, Connection.send_compound

    def counted_send(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent[0] += 1
        return send(self, *args, **kwargs)

    def counted_compound(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent[0] += 1
        return compound(self, *args, **kwargs)

    Connection.send = counted_send
    Connection.send_compound = counted_compound
    return sent


class Said:
    """The run's progress lines, each with when it came (time.time)."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self.changed = threading.Condition()

    def __call__(self, line: str) -> None:
        with self.changed:
            self.lines.append((time.time(), line))
            self.changed.notify_all()

    def when(self, pattern: str, timeout: float = 0.0) -> float | None:
        """When the first line matching `pattern` came, waiting up to `timeout` for it."""
        found = re.compile(pattern)
        with self.changed:
            self.changed.wait_for(lambda: any(found.search(line) for _, line in self.lines), timeout)
            return next((at for at, line in self.lines if found.search(line)), None)


def first_steps(share: Path, log_folder: str) -> list[float]:
    """When each node's stand-in began (its metrics' first line), in a log folder of the share."""
    starts = []
    for path in (share / log_folder.lstrip("/") / "metrics").glob("*-0.jsonl"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            starts.append(float(json.loads(path.read_text().splitlines()[0])["t"]))
    return starts


def scenario(size: int, follow_s: float, counts: Counts, folder: Path, smb: bool = False) -> dict[str, Any]:
    """One run of `size` stand-in nodes carrying the scenarios in turn: followed for `follow_s` (what the
    client and the emulator cost meanwhile), then LOST loses its node (noticed after DETECTION_S), the
    run's second attempt goes onto a spare node, where HUNG stops halfway: the hang found by its beats."""
    import hpcjob
    from hpcjob.job.layout import attempt_log_folder
    from hpcjob.store.logs import RunLogs, read_root_cause
    from hpcjob.store.share import LocalFolder

    script = folder / "train.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("raise SystemExit('the stand-in runs instead')\n")
    seconds = follow_s + 60  # the first attempt outlives its start and the following; HUNG stops at half
    hang_timeout_s = max(10.0, follow_s / 2)
    trips = smb_round_trips() if smb else [0]
    with (
        share_folder(folder, smb) as (share, reach, env),
        emulator(size, share, seconds, folder, "--stand-in-hang", f"{HUNG}:2") as head,
    ):
        profile(folder, share, head, reach, env)
        said = Said()
        options: dict[str, Any] = {"nodes": size, "no_env": True, "rdzv_port": free_port(),
                                   "env": {"HPCJOB_IFNAME": "lo"},
                                   "hang_timeout_s": hang_timeout_s}  # fmt: skip
        run = hpcjob.submit(script, cluster="emu", mount_step=False, retries=1, **options)
        figures: dict[str, Any] = {"nodes": size, "share": "smb" if smb else "folder"}
        with counting_share_calls() as share_counts:
            follower = threading.Thread(target=lambda: figures.update(summary=run.wait(said)))
            follower.start()
            deadline = time.monotonic() + 600
            while len(first_steps(share, run.record.log_folder)) < size:
                if time.monotonic() > deadline or not follower.is_alive():
                    raise SystemExit(f"bench_many_nodes: {size} nodes never all ran")
                time.sleep(0.5)

            def figures_now() -> tuple[float, ...]:
                share_calls = sum(share_counts.calls.values())
                return (counts.requests, counts.polls, share_calls, share_counts.bytes_read, trips[0],
                        own_cpu_s(), cpu_s(head.pid), time.monotonic())  # fmt: skip

            before = figures_now()
            time.sleep(follow_s / 2)
            figures["node_pss_mb"] = round(node_memory_mb("NODE0002"), 2)
            time.sleep(follow_s / 2)
            after = figures_now()
            lost = time.time()
            answer = head.command(f"lose {LOST} unreachable")
            if not answer.startswith("ok:"):
                raise SystemExit(f"bench_many_nodes: lose {LOST}: {answer}")
            follower.join()
        requests, polls, calls, read, sent, client, emulator_cpu, took = (
            b - a for a, b in zip(before, after, strict=True)
        )
        polls = max(1, polls)
        figures.update(
            polls=polls,
            requests_per_poll=round(requests / polls, 2),
            share_reads_per_poll=round(calls / polls, 2),
            share_kb_per_poll=round(read / polls / 1024, 1),
            client_cpu_s_per_min=round(client / took * 60, 2),
            emulator_cpu_s_per_min=round(emulator_cpu / took * 60, 2),
            peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        )
        if smb:
            figures["smb_round_trips_per_poll"] = round(sent / polls, 2)
        summary = figures.pop("summary")
        noticed = lost + DETECTION_S
        seen = said.when(r"^job \d+: Failed")  # the first attempt's job, as the client's poll saw it
        resubmitted = said.when(r"^attempt 2( of \d+)?: job ")
        second = f"{run.record.job_folder}/logs/{attempt_log_folder(run.run_id, 2)}"
        starts = first_steps(share, second)
        named = said.when(rf"on {HUNG} hung")
        cause = summary.root_cause
        hung_file = share / second.lstrip("/") / ".standin-hung"
        ok = seen and resubmitted and named and cause and cause.node == HUNG and len(starts) == size
        if not ok or not hung_file.is_file():
            lines = "\n".join(line for _, line in said.lines[-20:])
            raise SystemExit(f"bench_many_nodes: the scenarios did not happen as planned:\n{lines}")
        assert seen is not None and resubmitted is not None and named is not None
        hung_at = float(hung_file.read_text().split()[0])  # when HUNG stopped (its stand-in says)
        figures.update(
            lost_to_seen_s=round(seen - noticed, 1),
            seen_to_resubmitted_s=round(resubmitted - seen, 1),
            lost_to_first_running_s=round(min(starts) - noticed, 1),
            lost_to_running_s=round(max(starts) - noticed, 1),
            hang_named_s=round(named - hung_at, 1),
            hang_timeout_s=hang_timeout_s,
        )
        started = time.perf_counter()
        logs = RunLogs(LocalFolder(share), second, run.record.nodes)
        logs.exit_codes()
        read_root_cause(LocalFolder(share), second)
        figures["summary_s"] = round(time.perf_counter() - started, 3)
    return figures


def failing(size: int, folder: Path) -> float:
    """A job of `size` nodes whose NODE0002 fails halfway: seconds from its exit record to the client's
    end of the run naming it."""
    import hpcjob

    script = folder / "train.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("raise SystemExit('the stand-in runs instead')\n")
    with (
        share_folder(folder, False) as (share, reach, env),
        emulator(size, share, 20, folder, "--stand-in-fail", "NODE0002:3") as head,
    ):
        profile(folder, share, head, reach, env)
        run = hpcjob.submit(script, cluster="emu", mount_step=False, nodes=size, no_env=True,
                            rdzv_port=free_port(), env={"HPCJOB_IFNAME": "lo"})  # fmt: skip
        summary = run.wait()
        ended = time.time()
        cause = summary.root_cause
        if cause is None or cause.node != "NODE0002":
            raise SystemExit(f"bench_many_nodes: the failing node was not named: {cause}")
        exit_record = share / run.record.log_folder.lstrip("/") / "NODE0002.exit"
        failed_at = float(exit_record.read_text().split()[1])
        return round(ended - failed_at, 1)


def history(runs: int, folder: Path) -> dict[str, float]:
    """`runs` runs in a history of its own, then each command's seconds (a process each)."""
    env = {**os.environ, "XDG_STATE_HOME": str(folder / "state")}
    make = (
        "from hpcjob.store.runs import RunRecord, save_run\n"
        f"for i in range({runs}):\n"
        "    save_run(RunRecord(run_id=f'train-{i:06d}', name='train', backend='rest', job_folder='x',"
        " nodes=tuple(f'N{j}' for j in range(16)), cluster='lab', state='submitted', job_id=str(i)),"
        " command='hpcjob submit train.py', plan='{}')\n"
    )
    subprocess.run([sys.executable, "-c", make], env=env, check=True, cwd=REPO)
    timed = {}
    for name, args in (("last20_s", ["--last", "20"]), ("show_s", ["show", f"train-{runs // 2:06d}"]),
                       ("all_s", []), ("json_s", ["--json"])):  # fmt: skip
        best = float("inf")
        for _ in range(3):
            began = time.perf_counter()
            subprocess.run([sys.executable, "-m", "hpcjob.cli", "runs", *args], env=env, check=True,
                           stdout=subprocess.DEVNULL)  # fmt: skip
            best = min(best, time.perf_counter() - began)
        timed[name] = round(best, 3)
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "--version"], env=env, check=True, stdout=subprocess.DEVNULL
    )
    timed["cli_start_s"] = round(time.perf_counter() - began, 3)
    return timed


COLUMNS = {  # the table's columns: a figure's key, its header
    "nodes": "NODES", "share": "SHARE", "requests_per_poll": "REQ/POLL",
    "share_reads_per_poll": "SHARE/POLL",
    "smb_round_trips_per_poll": "SMB TRIPS/POLL", "client_cpu_s_per_min": "CLIENT CPU s/min",
    "emulator_cpu_s_per_min": "EMULATOR CPU s/min", "peak_rss_mb": "PEAK RSS MB",
    "node_pss_mb": "NODE PSS MB",
    "summary_s": "SUMMARY s", "failing_node_named_s": "FAILURE NAMED s",
    "lost_to_seen_s": "LOST->SEEN s", "seen_to_resubmitted_s": "SEEN->RESUBMITTED s",
    "lost_to_first_running_s": "LOST->FIRST RUNNING s", "lost_to_running_s": "LOST->ALL RUNNING s",
    "hang_named_s": "HANG NAMED s",
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,128,1000", help="the jobs' node counts, comma-separated")
    parser.add_argument("--follow", type=float, default=120.0, help="seconds a job is followed before a loss")
    parser.add_argument("--smb-sizes", default="128", help="the sizes run again with the share over smbd")
    parser.add_argument("--runs", type=int, default=10_000, help="runs in the history")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    smb_sizes = {int(size) for size in args.smb_sizes.split(",") if size}
    if min(sizes) < 2:
        parser.error("--sizes: 2 nodes at least (one is lost, another hangs)")
    counts = instrument()
    rows, lines = [], []
    with tempfile.TemporaryDirectory(prefix="bench-many-") as tmp:
        runs = history(args.runs, Path(tmp) / "history")
        print(
            f"bench_many_nodes: {args.runs} runs: " + ", ".join(f"{k} {v}" for k, v in runs.items()),
            flush=True,
        )
        for size in sizes:
            for smb in (False, True) if size in smb_sizes else (False,):
                if smb and not shutil.which("smbd"):
                    print(f"bench_many_nodes: {size} nodes over SMB skipped: no smbd here", flush=True)
                    continue
                name = f"{size}-{'smb' if smb else 'folder'}"
                figures = scenario(size, args.follow, counts, Path(tmp) / f"run-{name}", smb)
                if not smb:
                    figures["failing_node_named_s"] = failing(size, Path(tmp) / f"failing-{size}")
                figures["runs_10k_s"] = runs["last20_s"]
                figures["runs_10k"] = runs
                lines.append(json.dumps(figures))
                print(f"bench_many_nodes: {size} nodes ({figures['share']}) done", flush=True)
                rows.append(tuple(figures.get(key, "-") for key in COLUMNS))
    print()
    for line in table(tuple(COLUMNS.values()), rows):
        print(line)
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
