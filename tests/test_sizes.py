"""The one table of machine sizes (hpcjob.job.sizes, hpcjob/job/sizes.json), on the ground floor: what it
holds of each size with its sources, the 2026 sizes, no price without its source and date, and what reads
it (the NCCL settings, the RDMA rule, the GPUs per node when nothing else says, render saying which)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import pytest

from hpcjob.job import sizes
from hpcjob.job.fabric import image_family, nccl_env, topology_family
from hpcjob.job.sizes import (
    AARCH64,
    AMD,
    FROM_COMMAND_LINE,
    FROM_PROFILE,
    SizeTableError,
    gpus_per_node,
    read_table,
    size_table,
)

from .conftest import Result

H100, H200 = "Standard_ND96isr_H100_v5", "Standard_ND96isr_H200_v5"
MI300X, GB200 = "Standard_ND96isr_MI300X_v5", "Standard_ND128isr_NDR_GB200_v6"
HEALTH_CHECKS = "Azure/azurehpc-health-checks @0e0a1ac26a64b32ac4dd7632a529638505d3314a conf/"


def raw() -> dict[str, object]:
    return json.loads((resources.files("hpcjob.job") / "sizes.json").read_text(encoding="utf-8"))


def test_every_price_in_the_packaged_table_has_its_source_and_date() -> None:
    data = raw()
    rows = [data["head_node"], *data["sizes"].values(), *data["cpu_sizes"].values()]  # type: ignore[union-attr]
    prices = [(meter, price) for row in rows for meter, price in row.get("prices", {}).items()]  # type: ignore[union-attr]
    assert len(prices) >= 20  # the sizes' Linux prices and the head node's Windows one
    for meter, price in prices:
        assert meter in ("linux", "spot", "windows")
        assert re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", price["as_of"]), price
        assert len(price["source"].split()) >= 3 and price["region"] == "eastus", price
    assert "usd_per_hour" not in json.dumps([{k: v for k, v in row.items() if k != "prices"} for row in rows])


def test_a_price_without_its_source_or_date_or_a_number_is_refused() -> None:
    data = raw()
    row = data["sizes"][H100]  # type: ignore[index]
    for broken, says in (
        ({"usd_per_hour": 1.0, "region": "eastus", "as_of": "2026-11"}, "has no source"),
        ({"usd_per_hour": 1.0, "region": "eastus", "source": "a page"}, "has no as_of"),
        (
            {"usd_per_hour": float("nan"), "region": "eastus", "as_of": "2026-11", "source": "x"},
            "not a price",
        ),
    ):
        changed = {**data, "sizes": {H100: {**row, "prices": {"spot": broken}}}}
        with pytest.raises(SizeTableError, match=says):
            read_table(json.dumps(changed))


def test_the_2026_sizes_with_their_marks_from_microsoft_s_health_checks() -> None:
    table = size_table()
    h200, mi300x, gb200 = table.sizes[H200], table.sizes[MI300X], table.sizes[GB200]
    assert (h200.gpus, h200.nvme_disks, h200.quota_family, h200.nccl_family) == (
        8, 8, "standardNDISRH200V5Family", "ndv5"
    )  # fmt: skip
    assert (h200.mark("nccl_allreduce"), h200.mark("ib_bw_gdr")) == (
        sizes.Mark("nccl_allreduce", 431.0, "GB/s", f"{HEALTH_CHECKS}nd96isr_h200_v5.conf L53", 16384),
        sizes.Mark("ib_bw_gdr", 360.0, "Gb/s", f"{HEALTH_CHECKS}nd96isr_h200_v5.conf L61"),
    )
    a100 = table.sizes["Standard_NC48ads_A100_v4"].allreduce_mark
    assert a100 is not None and (a100.check, a100.value, a100.message_mb) == ("nccl_allreduce", 193.0, 16384)
    assert (mi300x.gpu_vendor, mi300x.gpus, mi300x.nccl_family, mi300x.nvme_total_gb) == (AMD, 8, None, 28000)
    rccl = mi300x.allreduce_mark  # what doctor judges an AMD node's all-reduce by
    assert rccl is not None and (rccl.check, rccl.value) == ("rccl_allreduce", 314.0)
    assert mi300x.mark("ib_bw_non_gdr") is not None and mi300x.mark("ib_bw_gdr") is None  # no GPUDirect
    assert (gb200.gpus, gb200.cpu_arch, gb200.marks, gb200.allreduce_mark) == (4, AARCH64, (), None)
    assert (gb200.nvme_disks, gb200.nvme_total_gb, gb200.memory_gb) == (4, 16384, 900)
    for size in (h200, mi300x, gb200):
        assert size.prices == {}  # no sourced price: asked of the API, never guessed


def test_every_size_says_where_its_figures_come_from_and_every_mark_its_conf_line() -> None:
    for size in size_table().sizes.values():
        for mark in size.marks:
            assert mark.source.startswith(HEALTH_CHECKS) and re.search(r"\.conf L\d+$", mark.source), mark
        assert size.gpu_vendor in ("nvidia", "amd") and size.cpu_arch in ("x86_64", "aarch64")
    data = raw()["sizes"]
    for name in (H100, H200, MI300X, GB200):
        assert "MicrosoftDocs/azure-compute-docs" in data[name]["sources"]  # type: ignore[index]


def test_the_nccl_settings_and_the_rdma_rule_read_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table's family of each size is the one Azure's HPC image gives it (its own patterns), and its
    RDMA mark the HPC Pack templates' rule; both are read from the table, not worked out again."""
    from hpcjob.azure.template import is_rdma_capable

    table = size_table()
    for name, size in table.sizes.items():
        assert size.nccl_family == image_family(name), name
        parts = name.split("_")
        assert size.rdma == ("r" in parts[1].lower()), name
        assert is_rdma_capable(name) == size.rdma
    changed = dataclasses.replace(
        table.sizes["Standard_NC24ads_A100_v4"], nccl_family="ndv4", rdma=True
    )  # as if a new image and template said so
    monkeypatch.setattr(
        sizes, "size_table", lambda: dataclasses.replace(table, sizes={changed.name: changed})
    )
    monkeypatch.setattr("hpcjob.job.fabric.size_table", sizes.size_table)
    monkeypatch.setattr("hpcjob.azure.template.size_table", sizes.size_table)
    assert topology_family(changed.name) == "ndv4" and nccl_env(changed.name)
    assert is_rdma_capable(changed.name)
    assert topology_family("Standard_ND96isrf_H200_v5") == "ndv5"  # not in the table: the image's patterns


def test_gpus_per_node_come_from_the_command_line_then_the_profile_then_the_size_table() -> None:
    assert gpus_per_node(2, 4, H100) == (2, FROM_COMMAND_LINE)
    assert gpus_per_node(None, 4, H100) == (4, FROM_PROFILE)
    assert gpus_per_node(None, None, "standard_nd128isr_ndr_gb200_v6") == (
        4,
        f"the size table ({GB200}: 4 GPUs)",
    )
    assert gpus_per_node(None, None, "Standard_NC6_v9") == (None, None)  # a size the table does not hold
    assert gpus_per_node(None, None, None) == (None, None)


def test_a_cluster_job_gets_its_size_s_gpus_where_the_profile_says_none() -> None:
    from hpcjob.job.options import JobOptions
    from hpcjob.runner import with_profile
    from hpcjob.store.config import ClusterProfile

    profile = ClusterProfile("gpu", "https://head", "alice", vm_size=GB200)
    assert with_profile(JobOptions("x.py"), profile).gpus_per_node == 4
    assert with_profile(JobOptions("x.py", gpus_per_node=2), profile).gpus_per_node == 2
    assert with_profile(JobOptions("x.py", nproc_per_node=1), profile).gpus_per_node is None
    both = dataclasses.replace(profile, gpus_per_node=3)
    assert with_profile(JobOptions("x.py"), both).gpus_per_node == 3


def test_render_says_where_the_gpus_per_node_come_from(
    cli_with_profile: Callable[..., Callable[..., Result]], tmp_path: Path
) -> None:
    hpcjob = cli_with_profile("pw", url="https://head.example", user="alice")  # render reads no profile
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    nodes = ["--node", "GPU1", "--node", "GPU2", "--format", "json"]
    done = hpcjob("render", *nodes, "--vm-size", GB200, str(script))
    assert done.code == 0, done.err
    assert f"hpcjob: 4 GPU(s) per node, from the size table ({GB200}: 4 GPUs)" in done.err.splitlines()
    assert json.loads(done.out)["nproc_per_node"] == 4
    given = hpcjob("render", *nodes, "--vm-size", GB200, "--gpus-per-node", "2", str(script))
    assert "hpcjob: 2 GPU(s) per node, from the command line" in given.err.splitlines()
    plain = hpcjob("render", *nodes, str(script))
    assert "GPU(s) per node" not in plain.err


def test_onboarding_refuses_an_arm64_size_the_template_has_no_image_for() -> None:
    from hpcjob.azure.template import OnboardRequest, check_request

    problems = check_request(OnboardRequest("gpu1", "rg", "eastus", GB200, 2), size_table())
    assert problems == {
        "computeNodeVMSize": f"{GB200} runs aarch64 (Arm64) images only, and none of the pinned template's "
        "images (its computeNodeImage values) is one: deploy such nodes yourself and join them to the "
        "cluster, then choose them by node group or name"
    }
    assert check_request(OnboardRequest("gpu1", "rg", "eastus", H200, 2), size_table()) == {}
    assert check_request(OnboardRequest("gpu1", "rg", "eastus", MI300X, 2), size_table()) == {}
