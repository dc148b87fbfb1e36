"""What hpcjob costs the client and the head node as a job's nodes grow (issue 42), by simulation.

The local head node (hpcjob.emulator, in a process of its own) with N + 2 nodes whose ranks are stand-ins
(`--stand-in`: each task's real node.sh runs, then one bash process per node does what its ranks do for
the client: lines, beats, metrics, an exit record). For each size N, this process is the client: it
submits a job of N nodes through the REST API (`hpcjob.submit`, the profile's local folder standing in
for the share, no mount step) and follows it to its end (`Run.wait`), counting what it asks: REST
requests (at requests.Session), share calls and bytes (at hpcjob.store.share, CountingFolder), and the
follower's polls (RunLogs.look). Then a job of N nodes of which one fails halfway: how long from that
node's end to the client naming it. Then the run history: 10,000 runs, and the time of `runs --last 20`,
`runs show`, all of them and `runs --json` (whole commands, each its own process: the command line's
start included).

    .venv/bin/python benchmarks/bench_many_nodes.py [--sizes 16,128,1000] [--follow 120] [--runs 10000]

Prints a table, then one JSON line per size with at least nodes, requests_per_poll,
share_reads_per_poll, client_cpu_s_per_min, peak_rss_mb, summary_s, runs_10k_s, and the emulator's own
CPU beside the client's. Not measured yet (issue 42, open): a hang and a lost node among 1,000 (the
emulator takes them, `--stand-in-hang` and `lose NODE`), and the 128-node size through the test smbd.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
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


@contextlib.contextmanager
def emulator(
    nodes: int, share: Path, seconds: float, fail: str | None, folder: Path
) -> Iterator[dict[str, Any]]:
    """The head node in a process of its own, with `nodes` + 2 stand-in nodes: its URL, CA file, pid."""
    spec = [{"Name": f"NODE{i:04d}", "Cores": 4, "Groups": GPU} for i in range(1, nodes + 3)]
    nodes_file = folder / "nodes.json"
    nodes_file.write_text(json.dumps(spec))
    command = [sys.executable, "-m", "hpcjob.emulator", "--user", "alice", "--nodes-file", str(nodes_file),
               "--share-dir", str(share), "--grace-period", "1", "--command-line-limit", "0",
               "--stand-in", str(seconds)] + (["--stand-in-fail", fail] if fail else [])  # fmt: skip
    env = {**os.environ, "HPCJOB_EMULATOR_PASSWORD": PASSWORD}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert process.stdout is not None
    try:
        url, ca_file = process.stdout.readline().strip(), process.stdout.readline().strip()
        threading.Thread(target=process.stdout.read, daemon=True).start()  # the rest of what it says
        yield {"url": url, "ca_file": ca_file, "pid": process.pid}
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def profile(folder: Path, share: Path, head: dict[str, Any]) -> None:
    """The cluster `emu` in this benchmark's own config, its share a local folder."""
    os.environ.update(
        HPCJOB_CONFIG=str(folder / "clusters.toml"), BENCH_PW=PASSWORD, XDG_STATE_HOME=str(folder / "state")
    )
    add = [sys.executable, "-m", "hpcjob.cli", "cluster", "add", "emu", "--url", head["url"], "--user",
           "alice", "--password-env", "BENCH_PW", "--ca-bundle", head["ca_file"], "--share",
           "//HEADNODE/CcpSpoolDir",
           "--local-share", str(share), "--mount-point", str(share), "--node-group", "GPUNodes",
           "--poll-interval", "5"]  # fmt: skip
    subprocess.run(add, check=True, capture_output=True)


def follow(size: int, seconds: float, counts: Counts, folder: Path) -> dict[str, Any]:
    """A job of `size` stand-in nodes followed to its end: what it cost the client and the emulator."""
    import hpcjob

    share = folder / "share"
    share.mkdir(parents=True)
    script = folder / "train.py"
    script.write_text("raise SystemExit('the stand-in runs instead')\n")
    with emulator(size, share, seconds, None, folder) as head:
        profile(folder, share, head)
        emulator_before = cpu_s(head["pid"])
        options = {"nodes": size, "no_env": True, "rdzv_port": free_port(), "env": {"HPCJOB_IFNAME": "lo"}}
        run = hpcjob.submit(script, cluster="emu", mount_step=False, hang_timeout_s=600, **options)
        counts.reset()
        client_before, began = own_cpu_s(), time.monotonic()
        memory: list[float] = []
        sampler = threading.Timer(seconds / 2, lambda: memory.append(node_memory_mb("NODE0002")))
        sampler.start()
        with counting_share_calls() as share_counts:
            summary = run.wait()
        sampler.join()
        took = time.monotonic() - began
        client = own_cpu_s() - client_before
        emulator_cpu = cpu_s(head["pid"]) - emulator_before
        polls = max(1, counts.polls)
        started = time.perf_counter()
        from hpcjob.store.logs import RunLogs, read_root_cause
        from hpcjob.store.share import LocalFolder

        log_folder = run.record.log_folder
        logs = RunLogs(LocalFolder(share), log_folder, run.record.nodes)
        logs.exit_codes()
        read_root_cause(LocalFolder(share), log_folder)
        summary_s = time.perf_counter() - started
    return {
        "nodes": size,
        "state": summary.state.value,
        "followed_s": round(took, 1),
        "polls": counts.polls,
        "requests_per_poll": round(counts.requests / polls, 2),
        "share_reads_per_poll": round(sum(share_counts.calls.values()) / polls, 2),
        "share_kb_per_poll": round(share_counts.bytes_read / polls / 1024, 1),
        "client_cpu_s_per_min": round(client / took * 60, 2),
        "emulator_cpu_s_per_min": round(emulator_cpu / took * 60, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "node_pss_mb": round(memory[0], 1) if memory else None,
        "summary_s": round(summary_s, 3),
    }


def failing(size: int, folder: Path) -> float:
    """A job of `size` nodes whose NODE0002 fails halfway: seconds from its exit record to the client's
    end of the run naming it."""
    import hpcjob

    share = folder / "share"
    share.mkdir(parents=True)
    script = folder / "train.py"
    script.write_text("raise SystemExit('the stand-in runs instead')\n")
    with emulator(size, share, 20, "NODE0002:3", folder) as head:
        profile(folder, share, head)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,128,1000", help="the jobs' node counts, comma-separated")
    parser.add_argument("--follow", type=float, default=120.0, help="seconds each node runs")
    parser.add_argument("--runs", type=int, default=10_000, help="runs in the history")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    counts = instrument()
    rows, lines = [], []
    with tempfile.TemporaryDirectory(prefix="bench-many-") as tmp:
        runs = history(args.runs, Path(tmp) / "history")
        print(
            f"bench_many_nodes: {args.runs} runs: " + ", ".join(f"{k} {v}" for k, v in runs.items()),
            flush=True,
        )
        for size in sizes:
            figures = follow(size, args.follow, counts, Path(tmp) / f"follow-{size}")
            figures["failing_node_named_s"] = failing(size, Path(tmp) / f"failing-{size}")
            figures["runs_10k_s"] = runs["last20_s"]
            figures["runs_10k"] = runs
            lines.append(json.dumps(figures))
            print(f"bench_many_nodes: {size} nodes done", flush=True)
            rows.append((size, figures["requests_per_poll"], figures["share_reads_per_poll"],
                         figures["client_cpu_s_per_min"], figures["emulator_cpu_s_per_min"],
                         figures["peak_rss_mb"], figures["node_pss_mb"], figures["summary_s"],
                         figures["failing_node_named_s"]))  # fmt: skip
    print()
    header = ("NODES", "REQ/POLL", "SHARE/POLL", "CLIENT CPU s/min", "EMULATOR CPU s/min", "PEAK RSS MB",
              "NODE PSS MB", "SUMMARY s", "FAILURE NAMED s")  # fmt: skip
    for line in table(header, rows):
        print(line)
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
