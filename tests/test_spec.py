"""Validation of what the user asks for: each bad input is one line that names the problem."""

from __future__ import annotations

import pytest

from hpcjob.job.spec import JobSpec, SpecError, parse_env, parse_node_names, parse_share


def spec(**fields: object) -> JobSpec:
    return JobSpec(script="train.py", **fields)  # type: ignore[arg-type]


def test_defaults_follow_the_gpus_and_the_named_nodes() -> None:
    s = spec(node_names=("A", "B", "C"), gpus_per_node=8)
    assert (s.nodes, s.nproc_per_node, s.name, s.job_folder) == (3, 8, "train", "hpcjob/train")
    assert spec().node_count == 1 and spec().nproc_per_node == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nproc_per_node": 8, "gpus_per_node": 4}, "more than the 4 GPUs per node"),
        ({"nodes": 3, "node_names": ("A", "B")}, "2 node(s) named with --node, fewer than the 3"),
        ({"nodes": 1, "node_names": ("A", "B")}, "more than the 1"),
        ({"node_names": ("node1", "NODE1")}, "named twice"),
        ({"node_names": ("node_1",)}, "not a valid node name"),
        ({"node_names": ("-x",)}, "not a valid node name"),
        ({"node_names": ("node1.contoso.com",)}, "without a domain"),
        ({"nodes": 0}, "--nodes 0 must be at least 1"),
        ({"rdzv_port": 70000}, "--rdzv-port 70000"),
        ({"max_restarts": -1}, "--max-restarts -1"),
        ({"env": (("1X", "v"),)}, "a variable name"),
        ({"env": (("HF_TOKEN", "abc"),)}, "looks like a secret"),
        ({"env": (("DB_PASSWORD", "abc"),)}, "looks like a secret"),
        ({"env": (("PIP_INDEX_URL", "https://u:p@host/simple"),)}, "a URL with a user or token"),
        ({"env": (("GIT_URL", "HTTP://ghp_x@github.com/a/b"),)}, "a URL with a user or token"),
        ({"env": (("A", "x" * 3000),)}, "more than HPC Pack's 2048"),
        ({"env": (("A", "bell\x07"),)}, "control character"),
        ({"script_args": ("ok", "nul\x00")}, "control character"),
        ({"mount_point": "app"}, "absolute path"),
        ({"mount_options": "vers=3.0,password=hunter2"}, "must not hold a password"),
        ({"mount_options": "vers=3.0 ; rm -rf /"}, "comma-separated option list"),
        ({"job_folder": "../etc"}, "relative path of plain names"),
        ({"name": "my job"}, "job name"),
        ({"python": "python3 -X dev"}, "--python"),
    ],
)
def test_bad_input_is_one_line_naming_the_problem(fields: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as info:
        spec(**fields)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_script_must_be_python() -> None:
    with pytest.raises(SpecError, match="must be a Python file"):
        JobSpec(script="train.sh")


def test_parse_env_keeps_order_and_equals_in_values() -> None:
    assert parse_env(["A=1", "B=x=y", "A=2", "E="]) == (("A", "2"), ("B", "x=y"), ("E", ""))
    for bad in ["NOEQUALS", "=v"]:
        with pytest.raises(SpecError, match="must be NAME=VALUE"):
            parse_env([bad])


def test_parse_share_accepts_both_slash_styles() -> None:
    for text in ["//HEAD/CcpSpoolDir/app/x", r"\\HEAD\CcpSpoolDir\app\x"]:
        share = parse_share(text)
        assert share.unc == "//HEAD/CcpSpoolDir/app/x"
        assert share.windows_unc == r"\\HEAD\CcpSpoolDir\app\x"
    for bad in ["HEAD/CcpSpoolDir", "//HEAD", "//HEAD/Ccp Spool", "//HEAD/x/../y", "//HEAD/x/'y"]:
        with pytest.raises(SpecError, match="share"):
            parse_share(bad)


def test_node_names_keep_their_order_and_case() -> None:
    assert parse_node_names(["gpu2", "GPU1"]) == ("gpu2", "GPU1")


def test_a_run_id_leaves_room_for_its_mount_job_name() -> None:
    """HPC Pack job names hold 80 characters; the mount job is `<run id>-mount`."""
    from hpcjob.job.spec import check_run_id

    assert check_run_id("r" * 74) == "r" * 74
    with pytest.raises(SpecError, match="at most 74"):
        check_run_id("r" * 75)


def test_a_spec_goes_through_json_and_back_whole() -> None:
    """What a follower plans a run's next attempt from, kept in the run history (issue 33): every field
    set to something other than its default comes back the same."""
    import json
    from dataclasses import fields

    full = JobSpec(
        script="/home/alice/code/train.py",
        script_args=("--epochs", "5", "--lr=0.1"),
        name="exp",
        nodes=2,
        node_names=("GPU1", "gpu2"),
        node_group="GPU Nodes",
        nproc_per_node=4,
        gpus_per_node=8,
        share=parse_share("//HEAD/CcpSpoolDir/app/x"),
        mount_point="/mnt/alice",
        mount_options="vers=3.1",
        job_folder="hpcjob/alice/exp-1",
        owner="CONTOSO\\alice",
        rdzv_port=29500,
        rdzv_join_timeout=600,
        rdzv_last_call=10,
        rdzv_keep_alive=2,
        max_restarts=3,
        min_nodes=2,
        env=(("NCCL_DEBUG", "INFO"), ("A", "x=1")),
        python="/opt/venv/bin/python",
        command_limit=8000,
        runtime_s=3600,
        hang_timeout_s=120.5,
        priority="AboveNormal",
        job_template="GpuJobs",
        exclude_nodes=("GPU3",),
        requirements="torch==2.3\n",
        wheelhouse=("3.10", "manylinux2014_x86_64"),
        env_on="share",
        node_env_dir="/scratch/envs",
        image="nvcr.io/nvidia/pytorch:24.05-py3",
        docker_gpus="nvidia-docker",
        docker_options="--shm-size=16g",
        vm_size="Standard_ND96isr_H100_v5",
        resume_dir="/mnt/alice/hpcjob/alice/exp/checkpoints/exp-0",
        data_nodes=2,
        data_node_names=("CPU1", "cpu2"),
        data_node_group="CPU Nodes",
        data_port=29700,
        data_wait_s=60.0,
        secrets=("HF_HUB_TOKEN_FOR_JOB", "WANDB_API_KEY"),
        datasets=("datasets/imagenet", "https://acct.blob.core.windows.net/train/x:all"),
        dataset_timeout_s=600.0,
        local_dir="/scratch",
        dataset_cache_gb=500,
    )
    default = JobSpec(script="train.py")
    unset = [f.name for f in fields(JobSpec) if getattr(full, f.name) == getattr(default, f.name)]
    assert unset == [], "give the new field a value here, and see that it comes back"
    assert JobSpec.from_dict(json.loads(json.dumps(full.to_dict()))) == full
    newer = {**full.to_dict(), "a_field_of_a_newer_hpcjob": 1}
    assert JobSpec.from_dict(newer) == full
    with pytest.raises(SpecError, match="cannot be read"):
        JobSpec.from_dict({**full.to_dict(), "share": "//HEAD/CcpSpoolDir"})
    with pytest.raises(SpecError, match="--rdzv-port"):
        JobSpec.from_dict({**full.to_dict(), "rdzv_port": 0})


def test_a_node_named_by_a_number_is_a_count_that_was_meant() -> None:
    """`--node 2` ran one node named "2" (issue 39): no node can be named by digits alone."""
    with pytest.raises(SpecError, match=r"node '2' is a number, not a node's name: a count of nodes is -n 2"):
        parse_node_names(["2"])
    assert parse_node_names(["2GPU", "N2"]) == ("2GPU", "N2")


def test_a_line_names_a_few_nodes_each_and_many_by_the_first_the_last_and_their_number() -> None:
    """A progress line of a 1,000-node job named every node: 10 KB a line (issue 42)."""
    from hpcjob.job.spec import NODES_NAMED, nodes_said

    few = [f"GPU{i}" for i in range(1, NODES_NAMED + 1)]
    assert nodes_said(few) == ", ".join(few)
    many = [f"NODE{i:04d}" for i in range(1, 1001)]
    said = nodes_said(many)
    assert said == ", ".join(many[: NODES_NAMED - 1]) + ", ..., NODE1000 (1,000 nodes)"
    assert len(said) < 120
