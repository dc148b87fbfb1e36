"""`--image`: every task in a container, through the HPC Pack node agent's own Docker support.

What the agent does with the variables is read from its source (docs/facts/hpcpack-linux-agent-docker.md);
the emulator's nodes follow it, with a stand-in for docker's command line (tests/fake_docker.py) that
refuses what docker refuses and gives a container the image's environment, not the node's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpcjob.backends.local import free_port, local_node_folder
from hpcjob.job.plan import (
    DOCKER_IMAGE_VAR,
    DOCKER_NVIDIA_VAR,
    DOCKER_OPTIONS_VAR,
    DOCKER_SKIP_SSH_VAR,
    DOCKER_VOLUMES_VAR,
    make_plan,
)
from hpcjob.job.render import job_xml
from hpcjob.job.spec import SpecError
from hpcjob.store.config import ClusterProfile

from .conftest import IMAGE, RUN_ID, Result, cluster_spec, empty_script, run_local, stand_in_python
from .fake_docker import RUN_FLAGS, RUN_VALUED
from .test_rest_e2e import Cluster, emulated_cluster


def docker_run_words(options: str) -> list[str]:
    """The option names of CCP_DOCKER_START_OPTION as `docker run` gets them: split on blanks, unquoted."""
    words = options.split()
    names = []
    index = 0
    while index < len(words):
        name = words[index].partition("=")[0]
        names.append(name)
        index += 2 if name in RUN_VALUED and "=" not in words[index] else 1
    return names


def test_the_job_file_carries_the_image_and_what_multi_node_ddp_needs_of_the_container(
    golden: Callable[[str, str], None],
) -> None:
    spec = cluster_spec(2, image=IMAGE, requirements="timm==1.0.9\n")
    plan = make_plan(spec, spec.node_names, RUN_ID)
    golden("job-2node-image.xml", job_xml(plan))
    env = dict(plan.env)
    assert env[DOCKER_IMAGE_VAR] == IMAGE and "=" not in IMAGE  # the agent cuts the value at '='
    options = env[DOCKER_OPTIONS_VAR]
    assert {"--network=host", "--ipc=host", "--gpus=all"} <= set(options.split())
    unknown = [name for name in docker_run_words(options) if name not in RUN_VALUED | RUN_FLAGS]
    assert unknown == []
    assert not {'"', "'", "$", "*", "?"} & set(options)  # put in unquoted: nothing bash would reread
    volumes = env[DOCKER_VOLUMES_VAR].split(",")  # the agent makes each one -v
    assert "/app:/app" in volumes  # the share where the tasks' work folder and logs are, same path
    assert "/etc/passwd:/etc/passwd:ro" in volumes and "/home:/home" in volumes  # ~/.cache/hpcjob/envs
    assert all(v.count(":") in (1, 2) and v.split(":")[0].startswith("/") for v in volumes)
    assert env[DOCKER_SKIP_SSH_VAR] == "1" and DOCKER_NVIDIA_VAR not in env
    assert all(task.command_line == plan.command_line for task in plan.tasks)


def test_a_cluster_profile_s_docker_and_environment_settings_reach_the_job(
    cli_with_profile: Callable[..., Callable[..., Result]], tmp_path: Path
) -> None:
    profile = {
        "url": "https://head.contoso.com",
        "user": "alice",
        "share": "//HEADNODE/CcpSpoolDir/app",
        "docker_gpus": "none",
        "docker_options": "--device=/dev/infiniband",
        "env_on": "node-local",
        "node_env_dir": "/scratch/envs",
    }
    hpcjob = cli_with_profile("pw", **profile)
    script = empty_script(tmp_path)
    (script.parent / "requirements.txt").write_text("tinya==1.0\n")
    done = hpcjob("submit", "--dry-run", "--node", "N1", "--image", IMAGE, str(script))
    assert done.code == 0, done.err
    env = dict(re.findall(r"<Name>(\w+)</Name>\s*<Value>([^<]*)</Value>", done.out))
    assert env[DOCKER_OPTIONS_VAR].endswith("stack=67108864 --device=/dev/infiniband")  # no --gpus
    assert "/scratch/envs:/scratch/envs" in env[DOCKER_VOLUMES_VAR].split(",")
    assert env["HPCJOB_ENVS"] == "/scratch/envs" and env["HPCJOB_ENV_ON"] == "node-local"
    with pytest.raises(SpecError, match="cluster emu: docker_gpus '' must be one of gpus-all, nvidia-docker"):
        ClusterProfile(name="emu", url="https://head", user="alice", docker_gpus="")  # not the default


def test_older_nodes_get_the_gpus_through_nvidia_docker_and_more_options_from_the_profile() -> None:
    spec = cluster_spec(
        1,
        image=IMAGE,
        docker_gpus="nvidia-docker",
        docker_options="--device=/dev/infiniband  --cap-add=IPC_LOCK",
    )
    env = dict(make_plan(spec, spec.node_names, RUN_ID).env)
    assert env[DOCKER_NVIDIA_VAR] == "1" and "--gpus" not in env[DOCKER_OPTIONS_VAR]
    assert env[DOCKER_OPTIONS_VAR].endswith(" --device=/dev/infiniband --cap-add=IPC_LOCK")
    cpu = dict(make_plan(dataclasses.replace(spec, docker_gpus="none"), ("N1",), RUN_ID).env)
    assert DOCKER_NVIDIA_VAR not in cpu and "--gpus" not in cpu[DOCKER_OPTIONS_VAR]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"image": "Nvcr.io/NVIDIA/pytorch:24.05"}, "is not a well-formed image reference"),
        ({"image": "pytorch:2=3"}, "is not a well-formed image reference"),
        # Read as the nodes' filter reads it (one answer): Docker may take hex alone for a local image's ID.
        ({"image": "abc123"}, "Docker may read it as the ID of an image already on the node"),
        ({"image": IMAGE, "docker_options": "--label 'a b'"}, "unquoted into `docker run`"),
        ({"image": IMAGE, "docker_gpus": "amd"}, "docker_gpus 'amd' must be one of gpus-all, nvidia-docker"),
        ({"env": (("CCP_DOCKER_START_OPTION", "--privileged"),)}, "hpcjob sets the node agent's Docker"),
        # The agent reads its settings back from a file of the variables, by line, with an unanchored grep.
        ({"image": IMAGE, "env": (("X", "a\nCCP_DOCKER_START_OPTION=--privileged"),)}, "no line break"),
        ({"env": (("X", "a\rCCP_DOCKER_START_OPTION=--privileged"),)}, "no line break"),  # a template's image
        ({"env": (("A_CCP_DOCKER_IMAGE", "--privileged"),)}, "no other name may hold CCP_DOCKER_"),
        (
            {"image": IMAGE, "env": (("x_ccp_docker_volumes", "/:/host"),)},
            "no other name may hold CCP_DOCKER_",
        ),
        ({"image": IMAGE, "env": (("X", "CCP_DOCKER_IMAGE=evil"),)}, "may hold no CCP_DOCKER_"),
        ({"image": IMAGE, "env": (("PATH", "/usr/bin"),)}, "with --image the image's own PATH"),
        ({"image": IMAGE, "requirements": "x\n", "node_env_dir": "/usr/lib/envs"}, "is a system folder"),
    ],
)
def test_what_the_agent_would_misread_is_refused_in_one_line(fields: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(")) as caught:
        cluster_spec(2, **fields)
    assert "\n" not in str(caught.value)


def test_a_local_run_with_an_image_and_no_docker_says_so_in_one_line(tmp_path: Path) -> None:
    no_docker = tmp_path / "bin"
    no_docker.mkdir()
    for tool in ("bash", "sh", "env"):  # what a task needs, and no docker
        os.symlink(f"/bin/{tool}", no_docker / tool)
    env = {**os.environ, "PATH": str(no_docker)}
    result = run_local("--image", IMAGE, str(empty_script(tmp_path)), env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"hpcjob: error: --image {IMAGE} runs each node's task in a container, and this machine has no "
        "docker command: install Docker, or run without --image"
    ]
    assert not (Path(os.environ["XDG_DATA_HOME"]) / "hpcjob" / "local-share").exists() or not list(
        (Path(os.environ["XDG_DATA_HOME"]) / "hpcjob" / "local-share").rglob("logs/*")
    )  # nothing started, nothing left


@pytest.fixture
def image_cluster(
    fake_docker: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    for name, value in fake_docker.items():  # the nodes' own environment: docker on their PATH
        monkeypatch.setenv(name, value)
    yield from emulated_cluster(tmp_path)


@pytest.mark.slow
def test_a_job_with_an_image_runs_each_task_in_a_container_through_either_front_door(
    image_cluster: Cluster, tmp_path: Path, fake_docker: dict[str, str]
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(
        "import os, shutil\nprint('rank', os.environ['RANK'], os.environ.get('IMAGE_SAYS'), "
        "shutil.which('python3'), os.environ['PATH'], flush=True)\n"
    )
    job = ["--rdzv-port", str(free_port()), "--env", "HPCJOB_IFNAME=lo", "-n", "2", "--wait", "--json"]
    result = image_cluster.hpcjob(
        "submit", "--backend", "rest", *job, "--image", IMAGE, str(code / "train.py")
    )
    assert result.returncode == 0, result.stderr[-3000:]
    logs = image_cluster.hpcjob("logs", str(json.loads(result.stdout)["job_id"])).stdout
    image_path = json.loads(Path(fake_docker["FAKE_DOCKER_IMAGES"]).read_text())[IMAGE]["env"]["PATH"]
    # The image's variables and PATH, its python3: nothing of the node's own environment.
    assert logs.count(f" inside {image_path.split(':')[0]}/python3 {image_path}") == 2, logs[-3000:]
    calls = [json.loads(line) for line in Path(fake_docker["FAKE_DOCKER_LOG"]).read_text().splitlines()]
    runs = [call for call in calls if call[0] == "run"]
    assert len(runs) == 2 and all(call[1:4] == ["-id", "--network=host", "--ipc=host"] for call in runs)
    assert len([call for call in calls if call[:2] == ["rm", "-f"]]) == 2
    assert not list(Path(fake_docker["FAKE_DOCKER_STATE"]).glob("*.json"))  # every container removed

    # Through the other front door, the same job file with an image the nodes cannot pull.
    missing = image_cluster.hpcjob(
        "submit", "--backend", "winrm", *job, "--image", "contoso/missing:1", str(code / "train.py")
    )
    assert missing.returncode == 125  # docker's own, for a missing image
    assert not list(Path(fake_docker["FAKE_DOCKER_STATE"]).glob("*.json"))  # no container left
    cause = json.loads(missing.stdout)["root_cause"]["reason"]
    assert cause.startswith("docker: Error response from daemon: pull access denied for contoso/missing"), (
        cause
    )


def test_a_local_run_with_an_image_runs_each_node_in_a_container(
    tmp_path: Path, fake_docker: dict[str, str]
) -> None:
    python = stand_in_python(tmp_path, 'echo "$IMAGE_SAYS $PATH $CCP_NODES"; pwd')
    share = tmp_path / "share"
    env = {**os.environ, **fake_docker}
    where = ["--mount-point", str(share), "--python", str(python), "--run-id", "img-1", "-n", "2"]
    result = run_local("--quiet", *where, "--image", IMAGE, str(empty_script(tmp_path)), env=env)
    assert result.returncode == 0, result.stderr
    logs = share / "hpcjob" / "train" / "logs" / "img-1"
    image_path = json.loads(Path(fake_docker["FAKE_DOCKER_IMAGES"]).read_text())[IMAGE]["env"]["PATH"]
    for node in ("LOCAL1", "LOCAL2"):
        said = (logs / f"{node}.out").read_text().splitlines()
        assert said == [f"inside {image_path} 1 {node} {os.cpu_count()}", str(share / "hpcjob" / "train")]
    calls = [json.loads(line) for line in Path(fake_docker["FAKE_DOCKER_LOG"]).read_text().splitlines()]
    assert [call[:3] for call in calls] == [["run", "--rm", "--network=host"]] * 2
    assert all(f"{share}:{share}" in call and f"{os.getuid()}:{os.getgid()}" in call for call in calls)
    # Each node's own disk (its HPCJOB_LOCAL_DIR: datasets, checkpoints) is in its container.
    for node in ("LOCAL1", "LOCAL2"):
        own = local_node_folder(node)
        assert own.is_dir() and [call for call in calls if f"{own}:{own}" in call and node in " ".join(call)]
