"""Job options a `job submit` user expects: run-time limit, priority, job template, node exclusion."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hpcjob.emulator.jobxml import parse_job_xml
from hpcjob.job.plan import make_plan
from hpcjob.job.render import job_xml, mount_job_xml
from hpcjob.job.spec import SpecError, parse_duration

from .conftest import cluster_spec, empty_script, run_local, stand_in_python


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90m", 5400),
        ("12h", 43200),
        ("1d12h30m", 131400),
        ("45s", 45),
        ("30", 1800),
        ("2:30", 9000),
        ("1:02:03", 93780),
        (" 2H ", 7200),
    ],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0m", "1x", "h", "1:2:3:4", "-5m", "1.5h", "99999999d"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(SpecError, match="--runtime"):
        parse_duration(text)


def test_the_job_file_carries_them_and_the_scheduler_reads_them() -> None:
    spec = cluster_spec(2, runtime_s=93600, priority="AboveNormal", job_template="GpuJobs")
    plan = make_plan(spec, spec.node_names, "r-1")
    job = ET.fromstring(job_xml(plan))
    assert (job.get("RuntimeSeconds"), job.get("Priority"), job.get("JobTemplate")) == (
        "93600",
        "AboveNormal",
        "GpuJobs",
    )
    # The emulator's importer follows the scheduler's import map: the names are ones it reads.
    draft = parse_job_xml(job_xml(plan))
    assert (draft.props["RuntimeSeconds"], draft.props["Priority"], draft.props["JobTemplate"]) == (
        "93600",
        "AboveNormal",
        "GpuJobs",
    )
    mount = ET.fromstring(mount_job_xml(plan))  # the mount step: same template and priority, no limit
    assert (mount.get("RuntimeSeconds"), mount.get("Priority"), mount.get("JobTemplate")) == (
        None,
        "AboveNormal",
        "GpuJobs",
    )
    plain = ET.fromstring(job_xml(make_plan(cluster_spec(1), ("GPUNODE001",), "r-2")))
    assert {"RuntimeSeconds", "Priority", "JobTemplate"}.isdisjoint(plain.attrib)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"priority": "Urgent"}, "--priority 'Urgent' must be one of Lowest"),
        ({"job_template": "a;b"}, "--job-template 'a;b' is not a valid template name"),
        ({"exclude_nodes": ("GPUNODE002",)}, "node 'GPUNODE002' is both named with --node and excluded"),
        ({"exclude_nodes": ("bad name",)}, "node 'bad name' is not a valid node name"),
        ({"runtime_s": 0}, "--runtime 0 must be at least 1"),
    ],
)
def test_bad_job_options(fields: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        cluster_spec(2, **fields)


def test_run_local_cancels_a_job_past_its_run_time_limit(tmp_path: Path) -> None:
    python = stand_in_python(tmp_path, "exec sleep 60")  # never ends by itself
    started = time.monotonic()
    result = run_local(
        *("--json", "-n", "2", "--runtime", "2s", "--grace-period", "1"),
        *("--mount-point", str(tmp_path / "share"), "--python", str(python), str(empty_script(tmp_path))),
    )
    assert result.returncode == 130, result.stderr
    assert json.loads(result.stdout)["state"] == "Canceled"
    assert "the job exceeded its run-time limit of 2 s: canceling it" in result.stderr
    assert time.monotonic() - started < 15
