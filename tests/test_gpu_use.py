"""GPU use per node, as hpcjob shows it: the latest figures of a running job (`status`), and the run's
figures in the summary and its JSON. The nodes' Python is a stand-in that prints what the training
program prints (training/gpu_monitor.py; tests/training/test_gpu_monitor.py checks that side)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from hpcjob.cli.tables import format_summary, metrics_line
from hpcjob.job.results import GpuUse, JobSummary, State

from .conftest import empty_script, run_local, stand_in_python

# What a rank prints: `sh gpu.sh RANK UTIL MEMORY`
GPU_LINE = (
    """echo "HPCJOB_GPU {\\"rank\\": $1, \\"node\\": \\"$HPCJOB_NODE\\", """
    """\\"util_pct\\": $2, \\"memory_mib\\": $3}" """
)


def test_status_of_a_running_job_shows_each_node_s_latest_gpu_use(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu.sh"
    gpu.write_text(GPU_LINE)
    # Each node's two ranks report twice; the later line of a rank counts.
    python = stand_in_python(
        tmp_path,
        f"sh {gpu} 0 10 100; sh {gpu} 1 20 200; n=${{HPCJOB_NODE#LOCAL}}; sh {gpu} 0 $((n * 40)) 1000; "
        f"sh {gpu} 1 $((n * 40 + 10)) 3000; exec sleep 60",
    )
    command = [sys.executable, "-m", "hpcjob.cli"]
    job = ["-n", "2", "--run-id", "gpu-1", "--python", str(python), str(empty_script(tmp_path))]
    run = subprocess.Popen([*command, "run", "--local", *job], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:

        def status(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*command, "status", "gpu-1", *args], capture_output=True, text=True, timeout=60
            )

        deadline = time.monotonic() + 30
        while len(json.loads((shown := status("--json")).stdout or "{}").get("gpu_use", [])) < 2:
            assert time.monotonic() < deadline and run.poll() is None, shown.stderr
            time.sleep(0.2)
        assert json.loads(shown.stdout)["gpu_use"] == [
            {
                "node": "LOCAL1",
                "gpus": 2,
                "util_mean_pct": 45.0,
                "util_peak_pct": 50.0,
                "memory_peak_mib": 3000.0,
            },
            {
                "node": "LOCAL2",
                "gpus": 2,
                "util_mean_pct": 85.0,
                "util_peak_pct": 90.0,
                "memory_peak_mib": 3000.0,
            },
        ]
        text = status().stdout.splitlines()
        assert [line.split() for line in text[-3:]] == [
            ["NODE", "GPUS", "GPU", "UTIL", "NOW", "GPU", "MEMORY", "NOW"],
            ["LOCAL1", "2", "45%", "2.9", "GiB"],
            ["LOCAL2", "2", "85%", "2.9", "GiB"],
        ]
    finally:
        run.terminate()
        run.communicate(timeout=30)


def test_the_summary_shows_the_run_s_gpu_use_per_node(tmp_path: Path) -> None:
    gpus = [
        {
            "rank": r,
            "node": f"LOCAL{r // 2 + 1}",
            "util_mean_pct": 50.0 + r,
            "util_peak_pct": 90.0 + r,
            "memory_peak_mib": 500 * (r + 1),
        }
        for r in range(4)
    ]
    metrics = {"accuracy": 0.9, "gpus": gpus}
    python = stand_in_python(tmp_path, f"echo 'HPCJOB_METRICS {json.dumps(metrics)}'")
    done = run_local("-n", "2", "--json", "--python", str(python), str(empty_script(tmp_path)))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["metrics"]["gpus"] == gpus  # per rank, as the program said
    assert summary["gpu_use"] == [
        {
            "node": "LOCAL1",
            "gpus": 2,
            "util_mean_pct": 50.5,
            "util_peak_pct": 91.0,
            "memory_peak_mib": 1000.0,
        },
        {
            "node": "LOCAL2",
            "gpus": 2,
            "util_mean_pct": 52.5,
            "util_peak_pct": 93.0,
            "memory_peak_mib": 2000.0,
        },
    ]
    assert JobSummary.from_json(done.stdout).gpu_use == [
        GpuUse("LOCAL1", 2, 50.5, 91.0, 1000.0),
        GpuUse("LOCAL2", 2, 52.5, 93.0, 2000.0),
    ]


def test_the_summary_text_has_a_gpu_table_and_no_list_in_the_metrics_line() -> None:
    gpus = [
        {"rank": 0, "node": "GPU1", "util_mean_pct": 97.4, "util_peak_pct": 100.0, "memory_peak_mib": 81000}
    ]
    summary = JobSummary(
        "train", "r-1", State.FINISHED, 0, 12.0, "/j", "/j/logs/r-1", metrics={"accuracy": 0.5, "gpus": gpus}
    )
    lines = format_summary(summary).splitlines()
    assert lines[-4].strip() == "metrics: accuracy=0.5"
    assert [line.split() for line in lines[-3:-1]] == [
        ["NODE", "GPUS", "GPU", "UTIL", "MEAN", "GPU", "UTIL", "PEAK", "GPU", "MEMORY", "PEAK"],
        ["GPU1", "1", "97%", "100%", "79.1", "GiB"],
    ]
    assert metrics_line({"gpus": gpus, "samples_per_sec": 1234.5}) == "samples_per_sec=1234"
    plain = JobSummary("train", "r-2", State.FINISHED, 0, 1.0, "/j", "/j/logs/r-2", metrics={"accuracy": 0.5})
    assert "GPU" not in format_summary(plain) and "gpu_use" not in plain.to_json()  # absent, not zeros
