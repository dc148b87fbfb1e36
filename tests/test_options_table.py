"""The job's options are one table (hpcjob.job.options.JobOptions): the command line, the Python API and
the cluster profile read each option from it, under one name, the same way."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import pytest

import hpcjob
from hpcjob.cli import cli
from hpcjob.job.options import JobOptions, job_options, profile_keys
from hpcjob.job.spec import Share, SpecError
from hpcjob.store.config import ClusterProfile

from .conftest import empty_script


def test_the_command_line_s_text_and_the_api_s_values_are_read_into_the_same_options() -> None:
    said = {
        "script": "train.py",
        "script_args": ("--epochs", "2"),
        "nodes": "2",
        "runtime_s": "90m",
        "hang_timeout_s": "120",  # a bare number is seconds here, minutes for --runtime (the scheduler's)
        "data_wait_s": "5m",
        "env": ("A=1", "B=x=y"),
        "node_names": ("GPU1", "GPU2"),
        "share": "//HEAD/CcpSpoolDir/app",
        "wheelhouse": "3.10",
        "priority": "High" + "est",
        "requirements": "reqs.txt",
    }
    given = {
        "script": "train.py",
        "script_args": ["--epochs", "2"],
        "nodes": 2,
        "runtime_s": 5400,
        "hang_timeout_s": 120,
        "data_wait_s": 300.0,
        "env": {"A": "1", "B": "x=y"},
        "node_names": ["GPU1", "GPU2"],
        "share": Share("HEAD", "CcpSpoolDir", ("app",)),
        "wheelhouse": "3.10",
        "priority": "Highest",
        "requirements": Path("reqs.txt"),
    }
    assert JobOptions.read(said) == JobOptions.read(given)
    read = JobOptions.read(given)
    assert (read.runtime_s, read.env, read.wheelhouse) == (
        5400,
        (("A", "1"), ("B", "x=y")),
        ("3.10", "manylinux_2_28_x86_64"),
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"nodse": 2}, "no job option nodse (did you mean nodes?)"),
        ({"exclude_node": "N1"}, "no job option exclude_node (did you mean exclude_nodes?)"),
        ({"runtime": "90m"}, "no job option runtime (did you mean runtime_s?)"),
        ({"nodes": 0}, "--nodes 0 must be at least 1"),
        ({"nodes": True}, "--nodes must be a whole number, not True"),
        ({"nodes": "two"}, "--nodes must be a whole number, not 'two'"),
        ({"runtime_s": "soon"}, "--runtime 'soon' must be a duration such as 90m"),
        ({"runtime_s": -5}, "--runtime must be a duration (90m, 12h) or a number of seconds above 0"),
        ({"priority": "Urgent"}, "--priority 'Urgent' must be one of Lowest"),
        ({"requirements": False}, "--requirements must say something: a string, not False"),
        ({"no_env": "yes"}, "--no-env is a switch: True or False, not 'yes'"),
        ({"env": ["NOEQUALS"]}, "--env 'NOEQUALS' must be NAME=VALUE"),
        ({"node_names": ["GPU1", 2]}, "--node takes names"),
        ({"docker_gpus": "all"}, "docker_gpus= 'all' must be one of gpus-all"),
    ],
)
def test_a_bad_option_is_one_line_in_the_command_line_s_words(values: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as info:
        JobOptions.read({"script": "train.py", **values})
    assert str(info.value).startswith(message)


def test_the_python_api_refuses_an_option_it_does_not_know_before_anything_starts(tmp_path: Path) -> None:
    from hpcjob.store.runs import history

    before = len(history())
    with pytest.raises(
        hpcjob.SpecError, match=r"^no job option gpus_pernode \(did you mean gpus_per_node\?\)$"
    ):
        hpcjob.submit(empty_script(tmp_path), gpus_pernode=4)
    with pytest.raises(hpcjob.SpecError, match=r"^no job option node \(did you mean node_names\?\)$"):
        hpcjob.render_job(empty_script(tmp_path), node_names=["N1"], node="N2")
    assert len(history()) == before


@pytest.mark.parametrize("command", ["submit", "run", "render"])
def test_each_job_command_has_each_option_of_the_table_under_its_name(command: str) -> None:
    """The click parameter of each option with a flag is named as the option: what the command passes on
    is read by the same names as the API's keywords."""
    found = cli.get_command(click.Context(cli), command)
    assert found is not None
    params = {p.name: p for p in found.params if isinstance(p, click.Option)}
    for name, how in job_options():
        if how.flag is None:
            assert name not in params
            continue
        assert name in params, f"{command} lacks {how.flag}"
        flags = params[name].opts
        assert how.flag in flags and (how.short is None or how.short in flags), (name, flags)
        assert params[name].help == how.help


def test_each_profile_key_of_the_table_is_a_profile_field_that_fills_in_the_option() -> None:
    """An option the table marks as the profile's is a ClusterProfile field of the same name, and a job
    that does not say it gets the profile's value; one that says it keeps its own."""
    from hpcjob.runner import with_profile

    values: dict[str, Any] = {
        "share": "//HEAD/CcpSpoolDir/app",
        "node_group": "GPUs",
        "data_node_group": "CPUs",
        "env_on": "share",
        "node_env_dir": "/scratch/envs",
        "docker_gpus": "nvidia-docker",
        "docker_options": "--ipc=host",
        "rdzv_port": 29555,
        "vm_size": "Standard_ND96isr_H100_v5",
        "mount_point": "/mnt/share",
        "gpus_per_node": 4,
        "secrets": ("HF_TOKEN",),
        "datasets": ("datasets/imagenet",),
        "local_dir": "/scratch",
        "dataset_cache_gb": 500,
    }
    profile_fields = {f.name for f in dataclasses.fields(ClusterProfile)}
    assert set(profile_keys()) <= profile_fields and set(profile_keys()) == set(values)
    profile = ClusterProfile("lab", "https://head", "alice", **values)
    filled = with_profile(JobOptions("train.py"), profile)
    assert filled == JobOptions.read({"script": "train.py", "owner": "alice", **values})
    own = JobOptions.read(
        {"script": "train.py", "node_group": "Mine", "rdzv_port": 30000, "secrets": ["MINE"]}
    )
    kept = with_profile(own, profile)
    assert (kept.node_group, kept.rdzv_port, kept.secrets) == ("Mine", 30000, ("HF_TOKEN", "MINE"))


def test_the_options_the_job_spec_takes_are_its_fields_by_the_same_names() -> None:
    from hpcjob.job.spec import JobSpec

    spec_fields = {f.name for f in dataclasses.fields(JobSpec)}
    for name, how in job_options():
        if name != "requirements":  # the file's name; the JobSpec holds its text
            assert (name in spec_fields) == how.spec, f"{name}: the JobSpec field of the same name takes it"
