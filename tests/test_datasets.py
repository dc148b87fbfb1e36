"""`--dataset` (issue 41): sources read and refused, what the job says of them, and local nodes that copy a
folder of the share onto their own disks, keep it, and fetch again only what changed."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcjob.job.datasets import (
    BLOB,
    SHARE,
    SOURCES_VAR,
    Dataset,
    local_dir,
    parse_dataset,
    parse_datasets,
)
from hpcjob.job.plan import LOCAL_DIR_VAR, make_plan
from hpcjob.job.spec import JobSpec, SpecError

AZURITE = "http://127.0.0.1:10000/devstoreaccount1"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (
            "https://acct.blob.core.windows.net/train/imagenet/2026",
            Dataset("https://acct.blob.core.windows.net/train/imagenet/2026", BLOB, "trainers", "2026",
                    "imagenet/2026/", "https://acct.blob.core.windows.net", "train"),
        ),
        (
            "https://acct.blob.core.windows.net/train/:all",
            Dataset("https://acct.blob.core.windows.net/train/", BLOB, "all", "train", "",
                    "https://acct.blob.core.windows.net", "train"),
        ),
        (
            f"{AZURITE}/data-1/shards:data",
            Dataset(f"{AZURITE}/data-1/shards", BLOB, "data", "shards", "shards/", AZURITE, "data-1"),
        ),
        ("datasets/imagenet",
         Dataset("datasets/imagenet", SHARE, "trainers", "imagenet", "datasets/imagenet")),
        ("datasets/tiny/:all", Dataset("datasets/tiny/", SHARE, "all", "tiny", "datasets/tiny")),
    ],
)  # fmt: skip
def test_a_source_is_read_with_its_role_and_name(given: str, expected: Dataset) -> None:
    assert parse_dataset(given) == expected


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("", "--dataset: empty: give a Blob URL or a folder on the share"),
        (
            "ftp://acct.blob.core.windows.net/c",
            "a Blob source is an https:// URL (or http:// for an emulator)",
        ),
        ("http://acct.blob.core.windows.net/c", "Azure Storage is reached over https://"),
        ("https://acct.blob.core.windows.net/c/x?sv=1&sig=abc", "no query in the URL (a SAS is a secret"),
        ("https://u:pw@acct.blob.core.windows.net/cont", "no user or password in the URL"),
        ("https://acct.blob.core.windows.net", "no container in the URL"),
        ("https://Acct.blob.core.windows.net/cont", None),  # host names have no case: acct
        ("https://a.blob.core.windows.net/cont", "'a' is not a storage account name"),
        ("https://acct.blob.core.windows.net/Cont", "'Cont' is not a container name"),
        ("https://acct.blob.core.windows.net/a--b", "'a--b' is not a container name"),
        ("http://127.0.0.1:10000", "a path-style URL names the account"),
        ("http://127.0.0.1:99999/acct/cont", "port '99999' is not a port number"),
        ("https://acct.blob.core.windows.net/cont#frag", "no query in the URL"),
        ("https:///cont/x", "no host in the URL"),
        (f"{AZURITE}/cont/../etc", "'..' in a path"),
        (f"{AZURITE}/cont/a//b", "an empty name in a path"),
        ("datasets/../../etc", "'..' in a path"),
        ("/etc/passwd", "relative to the share's root (datasets/imagenet), not an absolute path"),
        ("C:/data", "not an absolute path"),
        ("datasets/a:b", "'a:b' is not a name a Windows folder can hold"),
        ("datasets/CON", "'CON' is not a name a Windows folder can hold"),
        ("datasets/trailing.", "is not a name a Windows folder can hold"),
    ],
)
def test_a_bad_source_is_one_line_naming_what_is_wrong(given: str, said: str | None) -> None:
    if said is None:
        assert parse_dataset(given).endpoint == "https://acct.blob.core.windows.net"
        return
    with pytest.raises(SpecError) as error:
        parse_dataset(given)
    assert said in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_two_sources_of_one_name_and_too_many_are_refused() -> None:
    with pytest.raises(SpecError, match=r"datasets/a/shards and .*/other/shards are both named 'shards'"):
        parse_datasets(["datasets/a/shards", f"{AZURITE}/other/shards"])
    with pytest.raises(SpecError, match="more than 32"):
        parse_datasets([f"datasets/d{i}" for i in range(33)])
    with pytest.raises(SpecError, match="between 10 seconds and 7 days"):
        JobSpec(script="train.py", nodes=1, datasets=("datasets/x",), dataset_timeout_s=1.0)


def test_the_job_says_its_datasets_in_one_variable_and_each_task_copies_first() -> None:
    spec = JobSpec(
        script="train.py", nodes=2, mount_point="/app", datasets=("datasets/tiny", f"{AZURITE}/cont/x:all")
    )
    plan = make_plan(spec, ["N1", "N2"], "run-1")
    env = dict(plan.env)
    assert json.loads(env[SOURCES_VAR]) == {
        "nodes": 2,
        "timeout_s": 3600.0,
        "sources": [
            {"name": "tiny", "kind": "share", "role": "trainers", "path": "/app/datasets/tiny"},
            {"name": "x", "kind": "blob", "role": "all", "endpoint": AZURITE, "container": "cont",
             "prefix": "x/"},
        ],
    }  # fmt: skip
    assert LOCAL_DIR_VAR not in env  # no size, no local_dir: the node finds its resource disk
    assert " && hpcjob_datasets python3 && python3 -m torch.distributed.run " in plan.command_line
    none = make_plan(JobSpec(script="train.py", nodes=2), ["N1", "N2"], "run-1")
    assert SOURCES_VAR not in dict(none.env) and "hpcjob_datasets" not in none.command_line
    # A size with local NVMe disks: their volume; the profile's local_dir wins.
    assert local_dir(None, "Standard_ND96isr_H200_v5") == "/mnt/nvme"
    assert local_dir(None, "Standard_NC24ads_A100_v4") is None
    assert local_dir("/scratch", "Standard_ND96isr_H200_v5") == "/scratch"
    nvme = make_plan(
        JobSpec(script="train.py", nodes=1, datasets=("datasets/x",), vm_size="Standard_ND96isr_H200_v5"),
        ["N1"],
        "run-1",
    )
    assert dict(nvme.env)[LOCAL_DIR_VAR] == "/mnt/nvme"
    assert "cache_bytes" not in json.loads(dict(nvme.env)[SOURCES_VAR])  # no cap: all the disk holds
    capped = make_plan(JobSpec(script="train.py", nodes=1, datasets=("datasets/x",), dataset_cache_gb=500),
                       ["N1"], "run-1")  # fmt: skip
    assert json.loads(dict(capped.env)[SOURCES_VAR])["cache_bytes"] == 500_000_000_000


def test_a_data_node_copies_for_its_role() -> None:
    spec = JobSpec(script="train.py", nodes=1, datasets=("datasets/x:data",), data_node_names=("D1",))
    plan = make_plan(spec, ["N1"], "run-1", data_node_names=["D1"])
    (data,) = [task for task in plan.tasks if task.node == "D1"]
    assert " && hpcjob_datasets python3 data && HPCJOB_ROLE=data " in data.command_line
    assert json.loads(dict(plan.env)[SOURCES_VAR])["nodes"] == 2  # the trainer waits for the data node too


def test_the_job_s_environment_must_fit_the_scheduler_s_limit_a_task() -> None:
    long = [f"datasets/{'d' * 100}{i}" for i in range(20)]
    with pytest.raises(
        SpecError, match=r"the job's environment is \d+ characters, more than HPC Pack's 2048"
    ):
        make_plan(JobSpec(script="train.py", nodes=1, datasets=tuple(long)), ["N1"], "run-1")
    with pytest.raises(SpecError, match=r"more than HPC Pack's 2048 a task: fewer or shorter"):  # any job's
        make_plan(JobSpec(script="train.py", nodes=1, env=(("BIG", "x" * 2000),)), ["N1"], "run-1")
    # What grows with the nodes stays out of it: 1,000 nodes' job has the environment of 2 nodes'.
    sizes = [
        sum(len(k) + len(v) + 2 for k, v in make_plan(JobSpec(script="t.py", nodes=n), nodes, "run-1").env)
        for n, nodes in ((2, ["N1", "N2"]), (1000, [f"GPUNODE{i:04d}" for i in range(1000)]))
    ]
    assert sizes[0] == sizes[1]


# --- two local nodes copy a folder of the share -------------------------------------------------------


SHOW = """import hashlib, os
root = os.environ["HPCJOB_DATASETS"]
for folder, _, files in sorted(os.walk(root, followlinks=True)):
    for name in sorted(files):
        path = os.path.join(folder, name)
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        print("HAS", os.environ["HPCJOB_NODE"], os.path.relpath(path, root), digest)
"""


def run_local(tmp_path: Path, run_id: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "run", "--local", "-n", "2",
         "--mount-point", str(tmp_path / "share"), "--run-id", run_id, *options,
         str(tmp_path / "code" / "show.py")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def held(output: str) -> dict[str, dict[str, str]]:
    """What each node's task found in HPCJOB_DATASETS: file -> digest, by node."""
    found: dict[str, dict[str, str]] = {}
    for line in output.splitlines():
        words = line.split()
        if "HAS" in words:
            _, node, name, digest = words[words.index("HAS") :]
            found.setdefault(node, {})[name] = digest
    return found


def read(err: str) -> dict[str, tuple[str, str]]:
    """What each node's task said it read: (from the source, from its cache), as its line says them."""
    said = re.findall(r"hpcjob: dataset tiny on (\S+): (.+) from the source, (.+) from the node's cache", err)
    return {node: (source, cache) for node, source, cache in said}


@pytest.mark.slow
def test_local_nodes_copy_a_share_folder_keep_it_and_fetch_only_what_changed(tmp_path: Path) -> None:
    source = tmp_path / "share" / "datasets" / "tiny"
    (source / "sub").mkdir(parents=True)
    blob = os.urandom(300_000)
    (source / "a.bin").write_bytes(blob)
    (source / "sub" / "b.txt").write_text("hello\n")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "show.py").write_text(SHOW)
    wanted = {
        "tiny/a.bin": hashlib.sha256(blob).hexdigest(),
        "tiny/sub/b.txt": hashlib.sha256(b"hello\n").hexdigest(),
    }

    first = run_local(tmp_path, "ds-1", "--dataset", "datasets/tiny")
    assert first.returncode == 0, first.stderr[-3000:]
    assert held(first.stdout) == {"LOCAL1": wanted, "LOCAL2": wanted}  # both nodes, identical bytes
    assert read(first.stdout + first.stderr) == {
        "LOCAL1": ("300.0 KB", "0 bytes"),
        "LOCAL2": ("300.0 KB", "0 bytes"),
    }
    # The summary says it in one line, and the history keeps each node's figures.
    said = first.stdout + first.stderr
    assert (
        "  datasets: 600.0 KB from the sources, 0 bytes from the nodes' caches, on 2 node(s); the slowest "
        in said
    )
    shown = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "runs", "show", "ds-1", "--json"], capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    copies = json.loads(shown.stdout)["summary"]["datasets"]
    figures = sorted((c["node"], c["name"], c["bytes_source"], c["bytes_cache"], c["files"]) for c in copies)
    assert figures == [("LOCAL1", "tiny", 300_006, 0, 2), ("LOCAL2", "tiny", 300_006, 0, 2)]

    second = run_local(tmp_path, "ds-2", "--dataset", "datasets/tiny")  # nothing changed: nothing read
    assert second.returncode == 0, second.stderr[-3000:]
    assert held(second.stdout) == {"LOCAL1": wanted, "LOCAL2": wanted}
    assert read(second.stdout + second.stderr) == {
        "LOCAL1": ("0 bytes", "300.0 KB"),
        "LOCAL2": ("0 bytes", "300.0 KB"),
    }

    (source / "sub" / "b.txt").write_text("changed\n")  # one file changes: it alone is fetched
    third = run_local(tmp_path, "ds-3", "--dataset", "datasets/tiny")
    assert third.returncode == 0, third.stderr[-3000:]
    assert held(third.stdout)["LOCAL2"]["tiny/sub/b.txt"] == hashlib.sha256(b"changed\n").hexdigest()
    assert read(third.stdout + third.stderr) == {
        "LOCAL1": ("8 bytes", "300.0 KB"),
        "LOCAL2": ("8 bytes", "300.0 KB"),
    }

    # A source that is gone: the task fails in one line naming the node; the last good copy stays.
    (source / "sub" / "b.txt").unlink()
    (source / "a.bin").unlink()
    gone = run_local(tmp_path, "ds-4", "--dataset", "datasets/tiny")
    assert gone.returncode != 0
    said = gone.stdout + gone.stderr
    assert f"hpcjob: error: LOCAL1: {source} holds no files" in said, said[-3000:]
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "hpcjob" / "nodes" / "LOCAL1" / "hpcjob"
    (kept,) = cache.glob("*/datasets/tiny-*/v*/a.bin")
    assert kept.read_bytes() == blob


def test_a_cluster_whose_nodes_local_folder_is_unknown_is_refused_before_submit(tmp_path: Path) -> None:
    from hpcjob.job.options import JobOptions
    from hpcjob.runner.submit import job_spec
    from hpcjob.store.config import ClusterProfile

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    options = JobOptions.read({"script": str(script), "datasets": ["datasets/imagenet"], "no_env": True})
    bare = ClusterProfile("lab", "https://head", "alice", share="//HEAD/CcpSpoolDir")
    with pytest.raises(SpecError, match=r"^--dataset: the nodes' local folder is not known: set local_dir"):
        job_spec(options, bare)
    for known in ({"local_dir": "/scratch"}, {"vm_size": "Standard_NC24ads_A100_v4"}):
        profile = ClusterProfile("lab", "https://head", "alice", share="//HEAD/CcpSpoolDir", **known)
        assert job_spec(options, profile).datasets == ("datasets/imagenet",)
    assert job_spec(options, local=True).local_dir is None  # each local node has a folder of its own
    with pytest.raises(SpecError, match="is not a container name"):
        job_spec(JobOptions.read({"script": str(script), "datasets": [f"{AZURITE}/X"]}), local=True)


def test_a_profile_s_datasets_are_read_as_the_option_s() -> None:
    from hpcjob.store.config import ClusterProfile

    with pytest.raises(SpecError, match=r"^cluster lab: datasets: --dataset /data: a folder on the share is"):
        ClusterProfile("lab", "https://head", "alice", datasets=("/data",))
    with pytest.raises(SpecError, match=r"^cluster lab: datasets must be an array of sources \(strings\)"):
        ClusterProfile("lab", "https://head", "alice", datasets=(1,))  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^cluster lab: local_dir 'scratch' must be an absolute path"):
        ClusterProfile("lab", "https://head", "alice", local_dir="scratch")


# --- two local nodes copy a Blob prefix from Azurite ---------------------------------------------------


def from_source(done: subprocess.CompletedProcess[str]) -> list[tuple[str, str]]:
    """What each node said it read from the source of the dataset `shards`."""
    return sorted(
        re.findall(r"dataset shards on (LOCAL\d): (.+?) from the source", done.stdout + done.stderr)
    )


@pytest.mark.slow
def test_local_nodes_copy_a_blob_prefix_checked_by_its_md5_and_keep_it(tmp_path: Path) -> None:
    """A real Azurite: the connection string reaches the tasks only through --secret; blobs with and
    without Content-MD5; a second run reads nothing; a blob whose bytes are not its MD5 fails the task in
    one line, the last good copy kept."""
    from azure.storage.blob import BlobServiceClient, ContentSettings

    from .azurite import azurite, require_azurite

    require_azurite()
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "show.py").write_text(SHOW)
    payload = {"shards/a.bin": os.urandom(200_000), "shards/deep/b.txt": b"hello\n"}
    with azurite() as service:
        client = BlobServiceClient.from_connection_string(service.connection_string)
        container = client.create_container("train")
        for name, data in payload.items():
            md5 = hashlib.md5(data).digest() if name.endswith(".bin") else None  # b.txt: ETag and size
            container.upload_blob(name, data, content_settings=ContentSettings(content_md5=md5))
        container.upload_blob("elsewhere.txt", b"not below the prefix")
        source = f"{service.endpoint}/train/shards"
        environ = {**os.environ, "AZURE_STORAGE_CONNECTION_STRING": service.connection_string}

        def run(run_id: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "hpcjob.cli", "run", "--local", "-n", "2",
                 "--mount-point", str(tmp_path / "share"), "--run-id", run_id, "--dataset", source,
                 "--no-env", "--secret", "AZURE_STORAGE_CONNECTION_STRING",
                 str(tmp_path / "code" / "show.py")],
                capture_output=True, text=True, timeout=180, env=environ,
            )  # fmt: skip

        wanted = {f"shards/{k[len('shards/') :]}": hashlib.sha256(v).hexdigest() for k, v in payload.items()}
        first = run("blob-1")
        assert first.returncode == 0, first.stderr[-3000:]
        assert held(first.stdout) == {"LOCAL1": wanted, "LOCAL2": wanted}
        assert from_source(first) == [("LOCAL1", "200.0 KB"), ("LOCAL2", "200.0 KB")]
        second = run("blob-2")
        assert second.returncode == 0, second.stderr[-3000:]
        assert from_source(second) == [("LOCAL1", "0 bytes"), ("LOCAL2", "0 bytes")]
        assert service.connection_string not in json.dumps(
            [p.read_text(errors="replace") for p in (tmp_path / "share").rglob("*") if p.is_file()]
        )  # nowhere on the share: not in the job, its logs or its history

        # Refused before anything starts, with the job's own credential: a container not there, a prefix
        # with nothing below it, a key the account refuses.
        for wrong, key, said in (
            (f"{service.endpoint}/missing/x", None, "no such container (or account)"),
            (f"{service.endpoint}/train/nothing", None, "no blobs below train/nothing/"),
            (source, service.connection_string.replace("AccountKey=Eby8", "AccountKey=AAAA"), "refused"),
        ):
            refused = subprocess.run(
                [sys.executable, "-m", "hpcjob.cli", "run", "--local", "-n", "1", "--no-env",
                 "--mount-point", str(tmp_path / "share"), "--run-id", "blob-no", "--dataset", wrong,
                 "--secret", "AZURE_STORAGE_CONNECTION_STRING", str(tmp_path / "code" / "show.py")],
                capture_output=True, text=True, timeout=120,
                env={**environ, "AZURE_STORAGE_CONNECTION_STRING": key or service.connection_string},
            )  # fmt: skip
            assert refused.returncode == 2, refused.stderr
            (line,) = refused.stderr.strip().splitlines()
            assert line.startswith(f"hpcjob: error: --dataset {wrong}: ") and said in line, line

        # Bytes that are not the blob's MD5 (a changed blob, its MD5 another's): one line, old copy kept.
        container.upload_blob("shards/a.bin", b"tampered", overwrite=True)
        tampered = container.get_blob_client("shards/a.bin")
        tampered.set_http_headers(ContentSettings(content_md5=hashlib.md5(b"other").digest()))
        bad = run("blob-3")
        assert bad.returncode != 0
        assert (
            "hpcjob: error: LOCAL1: blob shards/a.bin: its bytes are not its Content-MD5"
            in bad.stdout + bad.stderr
        ), (bad.stdout + bad.stderr)[-3000:]
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "hpcjob" / "nodes" / "LOCAL1" / "hpcjob"
    (kept,) = cache.glob("*/datasets/shards-*/v*/a.bin")
    assert kept.read_bytes() == payload["shards/a.bin"]


def test_a_task_s_figures_are_read_as_untrusted_and_said_in_one_line() -> None:
    from hpcjob.job.datasets import DatasetCopy, copies_line, dataset_copies
    from hpcjob.job.results import JobSummary, State

    good = {"name": "tiny", "bytes_source": 300_006, "bytes_cache": 0, "files": 2, "seconds": 1.5}
    hostile = [
        {**good, "bytes_source": -1}, {**good, "files": True}, {**good, "seconds": float("inf")},
        {**good, "name": 7}, "not a dict", {**good, "bytes_cache": "0"},
    ]  # fmt: skip
    copies = dataset_copies({"node": "GPU1", "datasets": [good, *hostile]})
    assert copies == [DatasetCopy("GPU1", "tiny", 300_006, 0, 2, 1.5)]
    assert dataset_copies({"datasets": [good]}) == [] and dataset_copies([good]) == []
    both = [*copies, DatasetCopy("GPU2", "tiny", 0, 300_006, 2, 0.2), DatasetCopy("GPU2", "x", 10, 0, 1, 4.0)]
    assert copies_line(both) == (
        "datasets: 300.0 KB from the sources, 300.0 KB from the nodes' caches, on 2 node(s); the slowest "
        "4.2 s (GPU2)"
    )
    summary = JobSummary("job", "run-1", State.FINISHED, 0, 1.0, "/j", "/j/logs", datasets=both)
    assert JobSummary.from_json(summary.to_json()) == summary


def test_a_blob_source_brings_its_pinned_sdk_into_the_job_s_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tomllib

    from hpcjob.job.datasets import BLOB_REQUIREMENT, IDENTITY_REQUIREMENT
    from hpcjob.job.options import JobOptions
    from hpcjob.runner.submit import job_spec
    from hpcjob.store.config import ClusterProfile

    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", "sv=2026-01-01&sig=x")
    pinned = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert pinned["optional-dependencies"]["blob"] == [BLOB_REQUIREMENT]  # one pin: the client's, the nodes'
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    profile = ClusterProfile("lab", "https://head", "alice", share="//HEAD/CcpSpoolDir", local_dir="/scratch")
    blob = {"script": str(script), "datasets": [f"{AZURITE}/train/x"], "secrets": ["AZURE_STORAGE_SAS_TOKEN"]}
    assert job_spec(JobOptions.read(blob), profile).requirements == f"{BLOB_REQUIREMENT}\n"  # made for it
    # No credential handed to the nodes: their managed identity, read with azure-identity.
    identity = {**blob, "secrets": []}
    assert (
        job_spec(JobOptions.read(identity), profile).requirements
        == f"{BLOB_REQUIREMENT}\n{IDENTITY_REQUIREMENT}\n"
    )
    (tmp_path / "requirements.txt").write_text("numpy==2.1\n")
    assert job_spec(JobOptions.read(blob), profile).requirements == f"numpy==2.1\n{BLOB_REQUIREMENT}\n"
    (tmp_path / "requirements.txt").write_text("Azure_Storage_Blob==12.20.0\n")  # the user's own wins
    assert job_spec(JobOptions.read(blob), profile).requirements == "Azure_Storage_Blob==12.20.0\n"
    share = {**blob, "datasets": ["datasets/x"]}
    assert job_spec(JobOptions.read(share), profile).requirements == "Azure_Storage_Blob==12.20.0\n"
    with pytest.raises(
        SpecError, match=r"^--dataset: a Blob source is copied with azure-storage-blob, and --no-env"
    ):
        job_spec(JobOptions.read({**blob, "no_env": True}), profile)
    # A local run's Python is this one, which has it (the blob extra): it runs as it is.
    assert job_spec(JobOptions.read({**blob, "no_env": True}), local=True).requirements is None


@pytest.mark.slow
def test_emulated_nodes_copy_a_share_folder_and_a_blob_prefix_each_onto_its_own_disk(tmp_path: Path) -> None:
    """Through the head node (REST, the real smbd, hpcjob's mount filter): two nodes of an Azure size
    without NVMe disks copy a share folder and a prefix of a real Azurite (its connection string a
    --secret, the SDK in the job's environment), each into its own local folder, and the run's history
    keeps it."""
    from azure.storage.blob import BlobServiceClient

    from .azurite import azurite, require_azurite
    from .test_rest_e2e import emulated_cluster

    require_azurite()
    for cluster in emulated_cluster(tmp_path):
        source = cluster.share_dir / "datasets" / "tiny"
        source.mkdir(parents=True)
        blob = os.urandom(100_000)
        (source / "a.bin").write_bytes(blob)
        (tmp_path / "code").mkdir()
        (tmp_path / "code" / "show.py").write_text(SHOW)
        with azurite() as service:
            client = BlobServiceClient.from_connection_string(service.connection_string)
            container = client.create_container("train")
            container.upload_blob("shards/s.bin", b"shard\n")
            cluster.env["AZURE_STORAGE_CONNECTION_STRING"] = service.connection_string
            done = cluster.submit(
                "--wait", "-n", "2", "--run-id", "emu-ds-1", "--vm-size", "Standard_NC24ads_A100_v4",
                "--dataset", "datasets/tiny", "--dataset", f"{service.endpoint}/train/shards",
                "--secret", "AZURE_STORAGE_CONNECTION_STRING", str(tmp_path / "code" / "show.py"),
            )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        logs = cluster.share_dir / "hpcjob" / "alice" / "show" / "logs" / "emu-ds-1"
        outputs = "".join(path.read_text() for path in sorted(logs.glob("*.out")))
        wanted = {
            "tiny/a.bin": hashlib.sha256(blob).hexdigest(),
            "shards/s.bin": hashlib.sha256(b"shard\n").hexdigest(),
        }
        found = held(outputs)
        assert len(found) == 2 and all(files == wanted for files in found.values()), outputs
        said = done.stdout + done.stderr
        assert "datasets: 200.0 KB from the sources, 0 bytes from the nodes' caches, on 2 node(s)" in said
        assert service.connection_string.split("AccountKey=")[1].split(";")[0] not in said
        kept = json.loads(cluster.hpcjob("runs", "show", "emu-ds-1", "--json").stdout)["summary"]["datasets"]
        copies = sorted((copy["node"], copy["name"]) for copy in kept)
        assert copies == sorted((node, name) for node in found for name in ("shards", "tiny"))


def test_a_share_source_missing_empty_or_too_big_for_a_local_node_is_refused_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil as real_shutil

    from hpcjob.runner import datasets as checks
    from hpcjob.store.share import LocalFolder

    (tmp_path / "datasets" / "empty").mkdir(parents=True)
    (tmp_path / "datasets" / "big").mkdir()
    (tmp_path / "datasets" / "big" / "a.bin").write_bytes(bytes(5000))
    folder = LocalFolder(tmp_path)

    def check(source: str) -> None:
        spec = JobSpec(script="train.py", nodes=2, datasets=(source,))
        checks.check_datasets(spec, make_plan(spec, ["LOCAL1", "LOCAL2"], "run-1"), folder, {}, local=True)

    with pytest.raises(SpecError, match=r"^--dataset datasets/gone: no such folder on the share$"):
        check("datasets/gone")
    with pytest.raises(
        SpecError, match=r"^--dataset datasets/empty: the folder on the share holds no files$"
    ):
        check("datasets/empty")
    check("datasets/big")
    usage = real_shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checks.shutil, "disk_usage", lambda _: usage._replace(free=1000))
    with pytest.raises(
        SpecError, match=r"^--dataset datasets/big: LOCAL1 has 1.0 KB free at .*, the dataset is 5.0 KB$"
    ):
        check("datasets/big")


@pytest.mark.slow
def test_two_runs_at_once_share_each_node_s_cache_under_its_lock(tmp_path: Path) -> None:
    """Two runs of one user start together on the same local nodes: one copies, the other waits for the
    lock and finds the copy done (each node reads the source once), and both see the same bytes."""
    source = tmp_path / "share" / "datasets" / "tiny"
    source.mkdir(parents=True)
    blob = os.urandom(2_000_000)
    (source / "a.bin").write_bytes(blob)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "show.py").write_text(SHOW)
    command = [sys.executable, "-m", "hpcjob.cli", "run", "--local", "-n", "2", "--mount-point",
               str(tmp_path / "share"), "--dataset", "datasets/tiny",
               str(tmp_path / "code" / "show.py")]  # fmt: skip
    runs = [
        subprocess.Popen([*command[:4], "--run-id", f"both-{i}", *command[4:]], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for i in (1, 2)
    ]  # fmt: skip
    said = []
    for run in runs:
        out, err = run.communicate(timeout=180)
        assert run.returncode == 0, err[-3000:]
        said.append(out + err)
        assert all(files == {"tiny/a.bin": hashlib.sha256(blob).hexdigest()} for files in held(out).values())
    for node in ("LOCAL1", "LOCAL2"):
        read = [re.findall(rf"dataset tiny on {node}: (.+?) from the source", text) for text in said]
        assert sorted(r[0] for r in read) == ["0 bytes", "2.0 MB"], read  # once from the source, once cached


NODE_HELPER = Path(__file__).resolve().parent.parent / "hpcjob" / "node" / "datasets.py"


class NodeCache:
    """The node helper run as node.sh runs it, for a task whose shell is `holder`, in a local folder of
    tmp_path's: each call an attempt of its own, one node, share folders as sources."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.local = tmp_path / "local"
        self.calls = 0

    def source(self, name: str, data: bytes) -> dict[str, str]:
        folder = self.tmp_path / "share" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "data.bin").write_bytes(data)
        return {"name": name, "kind": SHARE, "role": "trainers", "path": str(folder)}

    def copy(
        self, sources: list[dict[str, str]], holder: int, cap: int | None = None, nodes: int = 1
    ) -> tuple[Path, str]:
        """The task's folder of datasets, and what it said."""
        done = self.run(sources, holder, cap, nodes)
        assert done.returncode == 0, done.stderr
        return Path(done.stdout.strip()), done.stderr

    def log_dir(self) -> Path:
        """The next call's attempt's log folder."""
        return self.tmp_path / "logs" / f"attempt-{self.calls + 1}"

    def run(
        self, sources: list[dict[str, str]], holder: int, cap: int | None = None, nodes: int = 1
    ) -> subprocess.CompletedProcess[str]:
        log_dir = self.log_dir()
        self.calls += 1
        job: dict[str, object] = {"sources": sources, "nodes": nodes, "timeout_s": 60}
        if cap:
            job["cache_bytes"] = cap
        env = {**os.environ, SOURCES_VAR: json.dumps(job), LOCAL_DIR_VAR: str(self.local),
               "HPCJOB_LOG_DIR": str(log_dir), "HPCJOB_NODE": "N1"}  # fmt: skip
        return subprocess.run([sys.executable, str(NODE_HELPER), "trainers", str(holder)], env=env,
                              capture_output=True, text=True, timeout=90)  # fmt: skip

    def kept(self) -> list[str]:
        """The sources the cache holds, by name."""
        return sorted(p.name.rsplit("-", 1)[0] for p in self.local.glob("hpcjob/*/datasets/*"))


def test_a_running_task_keeps_its_copy_and_the_cache_drops_the_least_recently_used(tmp_path: Path) -> None:
    """A copy a live task reads stays as it was while a newer one is made; once the task is gone, its view
    and the old copy go; the cap drops the least recently used source no live task reads, never one that
    one does (it says so), and never the sources the task itself uses."""
    cache = NodeCache(tmp_path)
    first, second = subprocess.Popen(["sleep", "120"]), subprocess.Popen(["sleep", "120"])
    ended = subprocess.Popen(["true"])
    ended.wait()
    try:
        a = cache.source("a", b"1" * 1_000_000)
        held_by_first, _ = cache.copy([a], first.pid)
        a = cache.source("a", b"2" * 1_100_000)  # the source changes while the first task reads it
        held_by_ended, _ = cache.copy([a], ended.pid)
        assert (held_by_first / "a" / "data.bin").read_bytes()[:1] == b"1"
        assert (held_by_ended / "a" / "data.bin").read_bytes()[:1] == b"2"
        versions = list(cache.local.glob("hpcjob/*/datasets/a-*/v*"))
        assert len(versions) == 2

        first.kill()
        first.wait()
        b = cache.source("b", b"3" * 1_000_000)
        held_b, _ = cache.copy([b], second.pid, cap=2_500_000)
        # The ended tasks' views and the copy only the first read are gone; a's current copy stays.
        assert not held_by_first.exists() and not held_by_ended.exists()
        assert len(list(cache.local.glob("hpcjob/*/datasets/a-*/v*"))) == 1
        assert cache.kept() == ["a", "b"]

        c = cache.source("c", b"4" * 1_000_000)
        third = subprocess.Popen(["sleep", "120"])
        try:
            _, said = cache.copy([c], third.pid, cap=2_500_000)  # 3.1 MB: a, the least recently used, goes
            dropped = r"dataset cache on N1: dropped a-\w+ \(1.1 MB, over the cap of 2.5 MB\)"
            assert re.search(dropped, said), said
            assert cache.kept() == ["b", "c"]

            _, said = cache.copy([a], ended.pid, cap=1_500_000)  # b and c are read by live tasks
            assert "dropped" not in said
            assert "dataset cache on N1: 3.1 MB kept, over the cap of 1.5 MB: running jobs read it" in said
            assert cache.kept() == ["a", "b", "c"]
            assert (held_b / "b" / "data.bin").read_bytes() == b"3" * 1_000_000
        finally:
            third.kill()
            third.wait()
        second.kill()
        second.wait()
        _, said = cache.copy([c], ended.pid, cap=1_500_000)  # now nobody reads a or b: both go, oldest first
        assert re.findall(r"dropped (\w)-", said) == ["b", "a"], said
        assert cache.kept() == ["c"]
    finally:
        for task in (first, second):
            task.kill()
            task.wait()


def test_a_task_in_a_container_holds_its_copy_until_its_exit_record_is_there(tmp_path: Path) -> None:
    """A task in another pid namespace (an `--image` container: its processes are not seen from here)
    holds its copy while its exit record is missing; once node.sh wrote it, the copy may go."""
    cache = NodeCache(tmp_path)
    ended = subprocess.Popen(["true"])
    ended.wait()
    a = cache.source("a", b"1" * 1000)
    view, _ = cache.copy([a], ended.pid)
    holder_file = view.parent / f"{view.name}.json"
    holder = json.loads(holder_file.read_text())
    exit_record = Path(holder["exit"])
    assert exit_record == cache.tmp_path / "logs" / "attempt-1" / "N1.exit"
    holder_file.write_text(json.dumps({**holder, "pidns": "pid:[1]"}))  # another container's task
    cache.source("a", b"2" * 1000)
    cache.copy([a], ended.pid)
    assert (view / "a" / "data.bin").read_bytes() == b"1" * 1000  # still held
    exit_record.write_text("0 1795954215.5\n")
    cache.copy([a], ended.pid)
    assert not view.exists() and len(list(cache.local.glob("hpcjob/*/datasets/a-*/v*"))) == 1


def test_the_other_nodes_do_not_wait_for_one_whose_task_ended(tmp_path: Path) -> None:
    """Another node's task that ended before its copy was done (its exit record) never will be: the others
    fail at once naming it, not after --dataset-timeout (60 s here)."""
    cache = NodeCache(tmp_path)
    log_dir = cache.log_dir()
    log_dir.mkdir(parents=True)
    (log_dir / "N2.exit").write_text("1 1795954215.5\n")
    done = cache.run([cache.source("a", b"1")], os.getpid(), nodes=2)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "hpcjob: error: N1: N2 ended before its datasets were copied (its log says why): the job cannot start"
    )


def test_the_node_helper_s_names_are_the_client_s() -> None:
    """The node helper imports nothing of hpcjob: its copies of the job's names are kept one here."""
    import importlib.util

    from hpcjob.job import datasets as job

    sys.path.insert(0, str(NODE_HELPER.parent))  # its `env`, beside it as on the node
    try:
        spec = importlib.util.spec_from_file_location("node_datasets", NODE_HELPER)
        assert spec is not None and spec.loader is not None
        node = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(node)
    finally:
        sys.path.remove(str(NODE_HELPER.parent))
    for name in (
        "SOURCES_VAR",
        "LOCAL_DIR_VAR",
        "DONE_FOLDER",
        "RESOURCE_DISKS",
        "CONNECTION_STRING",
        "SAS_TOKEN",
    ):
        assert getattr(node, name) == getattr(job, name), name


@pytest.mark.parametrize(
    ("given", "volume"),
    [
        ({"vm_size": "Standard_ND96isr_H200_v5"}, "/mnt/nvme:/mnt/nvme"),
        ({"vm_size": "Standard_NC24ads_A100_v4"}, "/mnt:/mnt"),  # the resource disk, found on the node
        ({"vm_size": "Standard_NC24ads_A100_v4", "local_dir": "/scratch"}, "/scratch:/scratch"),
        ({}, None),  # not a cluster's size: the backend's own (a local run's node folders)
    ],
)
def test_a_container_gets_the_node_s_local_folder(given: dict[str, str], volume: str | None) -> None:
    from hpcjob.job.plan import DOCKER_VOLUMES_VAR

    image = "nvcr.io/nvidia/pytorch:24.05-py3"
    spec = JobSpec(script="train.py", nodes=1, image=image, datasets=("datasets/x",), **given)  # type: ignore[arg-type]
    volumes = dict(make_plan(spec, ["N1"], "run-1").env)[DOCKER_VOLUMES_VAR].split(",")
    local = [v for v in volumes if v.startswith(("/mnt", "/scratch"))]
    assert local == ([volume] if volume else [])
    plain = JobSpec(script="train.py", nodes=1, image=image, vm_size="Standard_ND96isr_H200_v5")
    assert "/mnt/nvme:/mnt/nvme" not in dict(make_plan(plain, ["N1"], "run-1").env)[DOCKER_VOLUMES_VAR]


def test_a_blob_source_read_with_the_nodes_identity_is_said_unchecked_before_submit() -> None:
    from hpcjob.runner.access import HpcjobWarning
    from hpcjob.runner.datasets import check_datasets

    spec = JobSpec(script="train.py", nodes=1, datasets=(f"{AZURITE}/train/x",))
    with pytest.warns(HpcjobWarning, match="read with the nodes' managed identity, which only they hold"):
        check_datasets(spec, make_plan(spec, ["N1"], "run-1"), None, {}, local=False)
