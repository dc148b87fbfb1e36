"""Each rank's GPU use: the monitor's figures, its HPCJOB_GPU lines as hpcjob reads them, and nothing at
all without a GPU. NVML is replaced by a reading function here; the CUDA test reads the real one."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator

import pytest
import torch
from hpcjob.job.results import GPU_PREFIX as READ_PREFIX
from hpcjob.job.results import GpuUse, gpu_use_of_run, latest_gpu_use

from gpu_monitor import GPU_PREFIX, GpuMonitor, GpuSample, open_monitor


def readings(*samples: tuple[float, float]) -> Iterator[GpuSample]:
    return iter(GpuSample(util, memory) for util, memory in samples)


def test_the_summary_holds_the_mean_the_peaks_and_the_epoch_s_window() -> None:
    source = readings((50, 1000), (100, 3000), (30, 2000), (90, 2500))
    monitor = GpuMonitor(lambda: next(source), "NVIDIA H200", rank=3, node="GPU2")
    assert monitor.summary() is None and monitor.window_util() is None  # no sample: nothing to say
    for _ in range(3):
        monitor.sample()
    assert monitor.window_util() == pytest.approx(60.0)
    monitor.sample()
    assert monitor.window_util() == pytest.approx(90.0)  # only what came since the last call
    assert monitor.summary() == {
        "rank": 3,
        "node": "GPU2",
        "gpu": "NVIDIA H200",
        "util_mean_pct": 67.5,
        "util_peak_pct": 100.0,
        "memory_peak_mib": 3000,
        "samples": 4,
    }


def test_the_figures_are_the_training_s_not_the_idle_start_up_s() -> None:
    """Readings before the first step (a CUDA context, the rendezvous: the GPU idle) count in no mean
    or utilisation peak; the memory peak stays. A training shorter than an interval gets one reading
    at its end, none when it had some."""
    source = readings((0, 4000), (0, 500), (80, 1000), (90, 1200), (70, 1100))
    monitor = GpuMonitor(lambda: next(source), "GPU")
    monitor.sample()
    monitor.sample()
    monitor.training_begins()
    assert monitor.summary() is None and monitor.window_util() is None
    assert monitor.report_line() is None  # no mean to report yet (and no division by no sample)
    monitor.training_ended()  # nothing since the first step: one reading now
    monitor.sample()
    monitor.training_ended()  # it has some: no other
    summary = monitor.summary()
    assert summary is not None
    assert (summary["util_mean_pct"], summary["util_peak_pct"], summary["samples"]) == (85.0, 90.0, 2)
    assert summary["memory_peak_mib"] == 4000
    assert monitor.window_util() == pytest.approx(85.0)


def test_the_thread_samples_and_prints_lines_that_hpcjob_reads() -> None:
    out = io.StringIO()
    counter = iter(range(1_000_000))
    monitor = GpuMonitor(
        lambda: GpuSample(float(next(counter) % 100), 512.0),
        "GPU",
        rank=1,
        node="LOCAL2",
        interval_s=0.01,
        report_every_s=0.03,
        out=out,
    ).start()
    deadline = time.monotonic() + 10
    while out.getvalue().count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    monitor.stop()
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and all(line.startswith(GPU_PREFIX) for line in lines)
    assert GPU_PREFIX == READ_PREFIX  # the two sides of the contract
    latest = json.loads(lines[-1].removeprefix(GPU_PREFIX))
    assert (latest["rank"], latest["node"], latest["memory_mib"]) == (1, "LOCAL2", 512)
    assert latest_gpu_use(lines) == [GpuUse("LOCAL2", 1, latest["util_pct"], latest["util_pct"], 512)]


def test_a_failing_reading_stops_the_watching_not_the_run() -> None:
    def broken() -> GpuSample:
        raise RuntimeError("NVML: GPU is lost")

    monitor = GpuMonitor(broken, "GPU", interval_s=0.01).start()
    time.sleep(0.1)
    monitor.stop()
    assert monitor.summary() is None


def test_no_monitor_without_a_cuda_device() -> None:
    assert open_monitor(torch.device("cpu"), 0) is None


def test_hpcjob_reads_the_run_s_gpu_use_per_node() -> None:
    ranks = [
        {"rank": 0, "node": "GPU1", "util_mean_pct": 80.0, "util_peak_pct": 99.0, "memory_peak_mib": 7000},
        {"rank": 1, "node": "GPU1", "util_mean_pct": 90.0, "util_peak_pct": 100.0, "memory_peak_mib": 7100},
        {"rank": 2, "node": "GPU2", "util_mean_pct": 40.0, "util_peak_pct": 70.0, "memory_peak_mib": 6900},
    ]
    assert gpu_use_of_run({"accuracy": 0.5, "gpus": ranks}) == [
        GpuUse("GPU1", 2, 85.0, 100.0, 7100),
        GpuUse("GPU2", 1, 40.0, 70.0, 6900),
    ]
    assert gpu_use_of_run({"accuracy": 0.5}) == [] and gpu_use_of_run(None) == []


def test_the_latest_line_of_each_rank_counts_and_broken_lines_do_not() -> None:
    def line(rank: int, node: str, util: float, memory: int) -> str:
        return GPU_PREFIX + json.dumps({"rank": rank, "node": node, "util_pct": util, "memory_mib": memory})

    lines = [
        line(0, "GPU1", 10, 100),
        line(1, "GPU1", 20, 300),
        "epoch 1/3 ...",
        line(0, "GPU1", 60, 200),
        GPU_PREFIX + '{"rank": 1, "node": "GPU1", "util',  # cut short by a dying node
        line(2, "GPU2", 95, 900),
    ]
    assert latest_gpu_use(lines) == [GpuUse("GPU1", 2, 40.0, 60.0, 300), GpuUse("GPU2", 1, 95.0, 95.0, 900)]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_real_gpu_is_watched() -> None:
    pytest.importorskip("pynvml", reason="needs nvidia-ml-py")
    device = torch.device("cuda", 0)
    monitor = open_monitor(device, 0, interval_s=0.05)
    assert monitor is not None
    busy = torch.rand(4096, 4096, device=device)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        busy = busy @ busy
        busy = busy / busy.norm()
    torch.cuda.synchronize()
    monitor.stop()
    summary = monitor.summary()
    assert summary is not None and summary["samples"] >= 5
    assert 0 < summary["util_peak_pct"] <= 100
    assert summary["memory_peak_mib"] >= 64  # the 4096x4096 float matrices at least
