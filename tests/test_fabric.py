"""The NCCL settings of each Azure GPU size, as Azure's HPC images set them (hpcjob.job.fabric), in the job:
under the job's own --env, shown by render, and the topology files in the job's containers."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcjob.cli.app import cli
from hpcjob.job.fabric import nccl_env, topology_family
from hpcjob.job.plan import DOCKER_VOLUMES_VAR, make_plan
from hpcjob.job.render import job_xml

from .conftest import RUN_ID, cluster_spec, empty_script

ND_H100 = "Standard_ND96isr_H100_v5"


@pytest.mark.parametrize(
    ("size", "family"),
    [
        (ND_H100, "ndv5"),
        ("standard_nd96isr_h200_v5", "ndv5"),  # the image lower-cases the size first
        ("Standard_ND96asr_v4", "ndv4"),
        ("Standard_ND96amsr_A100_v4", "ndv4"),
        ("Standard_ND40rs_v2", "ndv2"),
        ("Standard_NC96ads_A100_v4", "ncv4"),
        ("Standard_NC80adis_H100_v5", "ncv5"),
        ("Standard_NC24ads_A100_v4", None),  # no customisation: a quarter of the NC96's PCIe topology
        ("Standard_ND96isr_H300_v5", None),  # h[1-2]00 only
    ],
)
def test_each_size_gets_the_family_azure_s_image_gives_it(size: str, family: str | None) -> None:
    assert topology_family(size) == family


def test_the_nccl_settings_of_an_nd_size_are_in_the_job_under_its_own_env(
    golden: Callable[[str, str], None],
) -> None:
    spec = cluster_spec(
        2, gpus_per_node=8, vm_size=ND_H100, env=(("NCCL_DEBUG", "WARN"), ("NCCL_IGNORE_CPU_AFFINITY", "0"))
    )
    text = job_xml(make_plan(spec, spec.node_names, RUN_ID))
    golden("job-2node-nd-h100.xml", text)
    env = re.findall(r"<Name>(\w+)</Name>\s*<Value>([^<]*)</Value>", text)
    assert ("NCCL_IB_PCI_RELAXED_ORDERING", "1") in env
    assert ("NCCL_TOPO_FILE", "/opt/microsoft/ndv5/topo.xml") in env
    assert [value for name, value in env if name == "NCCL_IGNORE_CPU_AFFINITY"] == ["0"]  # --env wins
    assert nccl_env(None) == () and nccl_env("Standard_NC24ads_A100_v4") == ()


def test_a_container_gets_the_topology_files_only_where_the_size_names_them() -> None:
    def volumes(size: str) -> list[str]:
        spec = cluster_spec(2, vm_size=size, image="nvcr.io/nvidia/pytorch:24.05-py3")
        return dict(make_plan(spec, spec.node_names, RUN_ID).env)[DOCKER_VOLUMES_VAR].split(",")

    assert "/opt/microsoft:/opt/microsoft:ro" in volumes("Standard_ND96asr_v4")
    assert not any(v.startswith("/opt/microsoft") for v in volumes("Standard_NC24ads_A100_v4"))


def test_render_shows_them_and_a_size_that_is_no_size_is_one_line(tmp_path: Path) -> None:
    script = str(empty_script(tmp_path))
    job = ["render", "--node", "N1", "--node", "N2", "--run-id", "fabric-1"]
    shown = CliRunner().invoke(cli, [*job, "--vm-size", "Standard_ND96asr_v4", script])
    assert shown.exit_code == 0, shown.output
    assert "<Value>/opt/microsoft/ndv4/topo.xml</Value>" in shown.output
    bad = CliRunner().invoke(cli, [*job, "--vm-size", "ND96 v4", script])
    assert bad.exit_code != 0 and "--vm-size 'ND96 v4' must be an Azure VM size" in str(bad.exception)


def test_every_job_keeps_a_flight_record_on_the_share_unless_its_env_says_otherwise() -> None:
    spec = cluster_spec(1, env=(("TORCH_FR_BUFFER_SIZE", "0"),))
    plan = make_plan(spec, spec.node_names, RUN_ID)
    env = list(plan.env)
    assert [value for name, value in env if name == "TORCH_FR_BUFFER_SIZE"] == ["0"]  # the job's own
    assert ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1") in env
    assert ("TORCH_FR_DUMP_TEMP_FILE", f"{plan.log_dir}/nccl-trace-rank-") in env  # the run's log folder
