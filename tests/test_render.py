"""Generated artefacts, compared whole with golden files, and the job XML against the import map."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable

import pytest

from hpcjob.job.plan import make_plan
from hpcjob.job.render import JOB_NAMESPACE, clusrun_text, job_xml, plan_json, powershell_text
from hpcjob.job.render.text import ps_quote
from hpcjob.job.spec import SpecError

from .artefact_checks import check_powershell, powershell_errors, ps_shape
from .conftest import REFERENCE, RUN_ID, cluster_spec

NS = {"j": JOB_NAMESPACE}


def xml_for(nodes: int) -> str:
    spec = cluster_spec(nodes)
    return job_xml(make_plan(spec, spec.node_names, RUN_ID))


@pytest.mark.parametrize("nodes", [1, 2, 16])
def test_job_xml_golden(nodes: int, golden: Callable[[str, str], None]) -> None:
    golden(f"job-{nodes}node.xml", xml_for(nodes))


def test_elastic_job_xml_golden_and_the_emulator_takes_it(golden: Callable[[str, str], None]) -> None:
    """An elastic job (--min-nodes 2 of 3): the same exclusive node-unit job of all its nodes, but one
    failed task no longer ends it; torchrun's --nnodes=2:3, a store per rendezvous round."""
    from hpcjob.emulator.jobxml import parse_job_xml

    spec = cluster_spec(3, min_nodes=2, max_restarts=3)
    text = job_xml(make_plan(spec, spec.node_names, RUN_ID))
    golden("job-elastic-3node.xml", text)
    draft = parse_job_xml(text)
    assert (draft.props["FailOnTaskFailure"], draft.props["IsExclusive"]) == ("False", "True")
    assert (draft.props["MinNodes"], draft.props["MaxNodes"]) == ("3", "3")
    assert draft.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert all("--nnodes=2:3" in task.props["CommandLine"] for task in draft.tasks)
    rigid = cluster_spec(3, min_nodes=3, max_restarts=3)  # all nodes needed: the gang of old
    assert job_xml(make_plan(rigid, rigid.node_names, RUN_ID)).count('FailOnTaskFailure="true"') == 1


def test_clusrun_golden(golden: Callable[[str, str], None]) -> None:
    spec = cluster_spec(2)
    golden("clusrun-2node.txt", clusrun_text(make_plan(spec, spec.node_names, RUN_ID)))


def test_powershell_golden_and_syntax(golden: Callable[[str, str], None]) -> None:
    spec = cluster_spec(2)
    plan = make_plan(spec, spec.node_names, RUN_ID)
    text = powershell_text(plan)
    golden("submit-2node.ps1", text)
    assert not powershell_errors(text)
    check_powershell(plan, text, text)  # its values in their strings; the job file decodes to the XML
    assert ps_shape(text)[0] == GOLDEN_SHAPE


# The script's statements, each value quoted ('_'), the job file as a base64 array (@(_)).
GOLDEN_SHAPE = (
    "#_\n" * 11
    + """$ErrorActionPreference = '_'
if (-not (Get-PSSnapin Microsoft.HPC -ErrorAction SilentlyContinue)) { Add-PSSnapin Microsoft.HPC }
$runId = '_'
$logDir = '_'
#_
clusrun /user:system '_' '_'
if ($LASTEXITCODE -ne 0) { throw "mounting the share failed on a node (clusrun exit code $LASTEXITCODE)" }
$jobFile = Join-Path $env:TEMP ($runId + '_')
#_
#_
[System.IO.File]::WriteAllBytes($jobFile, [Convert]::FromBase64String(-join @(_)))
$job = New-HpcJob -JobFile $jobFile
Submit-HpcJob -Job $job
Write-Output "submitted job $($job.Id) (run $runId); logs: $logDir"
"""
)


def test_powershell_quotes_what_it_must() -> None:
    assert ps_quote("it's $HOME") == "'it''s $HOME'"
    assert ps_quote("\u2018a\u2019 \u201ab\u201b") == "'\u2018\u2018a\u2019\u2019 \u201a\u201ab\u201b\u201b'"
    spec = cluster_spec(1, share=None, env=(("NOTE", "it's $(rm -rf /) `x`"),))
    plan = make_plan(spec, spec.node_names, RUN_ID)
    text = powershell_text(plan)
    assert "clusrun" not in text  # no share: no mount step
    assert not powershell_errors(text)
    assert "$(rm" not in text  # the job file travels as base64 only
    check_powershell(plan, text, text)


def test_clusrun_needs_a_share() -> None:
    spec = cluster_spec(2, share=None)
    with pytest.raises(SpecError, match="--share"):
        clusrun_text(make_plan(spec, spec.node_names, RUN_ID))


def test_every_xml_name_is_in_the_schedulers_import_map() -> None:
    import_map = json.loads((REFERENCE / "job-xml-import-map.json").read_text())
    job_attributes = set(import_map["job_attributes"]) | {"xmlns"}
    task_attributes = set(import_map["task_attributes"])
    elements = set(import_map["elements"])
    root = ET.fromstring(xml_for(16).encode())
    for element in root.iter():
        tag = element.tag.removeprefix("{" + JOB_NAMESPACE + "}")
        assert tag in elements
        allowed = task_attributes if tag == "Task" else job_attributes if tag == "Job" else set()
        assert set(element.attrib) <= allowed, (tag, set(element.attrib) - allowed)


def test_job_xml_root_namespace_version_and_shape() -> None:
    text = xml_for(2)
    assert text.startswith('<?xml version="1.0" encoding="utf-8"?>\n<Job Version="3.000" ')
    root = ET.fromstring(text.encode())
    assert root.tag == f"{{{JOB_NAMESPACE}}}Job"
    assert root.get("UnitType") == "Node"
    assert (root.get("MinNodes"), root.get("MaxNodes")) == ("2", "2")
    assert (root.get("AutoCalculateMin"), root.get("AutoCalculateMax")) == ("false", "false")
    assert (root.get("IsExclusive"), root.get("FailOnTaskFailure")) == ("true", "true")
    assert root.get("RequestedNodes") == "GPUNODE001,GPUNODE002"
    tasks = root.findall("j:Tasks/j:Task", NS)
    assert [t.get("RequiredNodes") for t in tasks] == ["GPUNODE001", "GPUNODE002"]
    assert len({t.get("CommandLine") for t in tasks}) == 1
    variables = root.findall("j:EnvironmentVariables/j:Variable", NS)
    assert [(v.findtext("j:Name", namespaces=NS), v.findtext("j:Value", namespaces=NS)) for v in variables][
        5:
    ] == [  # after the flight recorder's five (test_plan_json_is_the_whole_plan)
        # The run's own checkpoint folder: a new run starts fresh, a restart of it finds its own.
        ("HPCJOB_CHECKPOINT_DIR", f"/app/hpcjob/run_ddp/checkpoints/{RUN_ID}"),
        # Its output folder: what `hpcjob pull` brings home besides its checkpoints and logs.
        ("HPCJOB_OUTPUT_DIR", f"/app/hpcjob/run_ddp/outputs/{RUN_ID}"),
        ("HPCJOB_ATTEMPT", "1"),  # which attempt of the run the job is (issue 33)
        ("NCCL_DEBUG", "WARN"),
        # A node that lost the share gets it back from hpcjob's execution filter before the task starts.
        ("HPCJOB_MOUNT", "//HEADNODE/CcpSpoolDir/app|/app"),
    ]


def test_plan_json_is_the_whole_plan() -> None:
    spec = cluster_spec(2)
    plan = make_plan(spec, spec.node_names, RUN_ID)
    data = json.loads(plan_json(plan))
    assert data["run_id"] == RUN_ID
    assert data["world_size"] == 8
    dump = f"{plan.log_dir}/nccl-trace-rank-"  # the flight recorder's, on the share
    assert data["env"] == {
        **{"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"},
        **{"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": dump},
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dump,
        "HPCJOB_CHECKPOINT_DIR": f"{plan.job_dir}/checkpoints/{RUN_ID}",
        "HPCJOB_OUTPUT_DIR": f"{plan.job_dir}/outputs/{RUN_ID}",
        "HPCJOB_ATTEMPT": "1",
        "NCCL_DEBUG": "WARN",
        "HPCJOB_MOUNT": plan.mount.filter_request if plan.mount else "",
    }
    assert [t["node"] for t in data["tasks"]] == ["GPUNODE001", "GPUNODE002"]
    assert data["mount"]["command"] == plan.mount.command if plan.mount else False
