"""The job XML importer: local names, optional namespace, case-insensitive attributes, ignored unknowns."""

from __future__ import annotations

import json

import pytest

from hpcjob.emulator.jobxml import parse_job_xml
from hpcjob.emulator.props import JOB_XML_ATTRIBUTES, TASK_XML_ATTRIBUTES, PropError

from ..conftest import REFERENCE, SHARED_REFERENCE
from .conftest import Client


def test_the_import_map_is_the_reference_one() -> None:
    reference = json.loads((REFERENCE / "job-xml-import-map.json").read_text())
    job = {"version", "runtime", *JOB_XML_ATTRIBUTES}
    assert job == {a.lower() for a in reference["job_attributes"]}
    task = {"version", "runtime", *TASK_XML_ATTRIBUTES}
    assert task == {a.lower() for a in reference["task_attributes"]}


def test_names_namespace_and_case() -> None:
    draft = parse_job_xml(
        '<Job unittype="Node" MINNODES="2" maxnodes="2" isExclusive="TRUE" Typo="x" Owner="someone">'
        "<EnvironmentVariables><Variable><Name>A</Name><Value>1</Value></Variable></EnvironmentVariables>"
        "<CustomProperties><Term><Name>C</Name><Value>3</Value></Term></CustomProperties>"
        '<Tasks><Task commandline="echo" STDOUT="o.txt" requirednodes="N1, N2" Runtime="01:30">'
        "<EnvironmentVariables><Variable><Name>B</Name><Value>2</Value></Variable></EnvironmentVariables>"
        "</Task></Tasks></Job>"
    )
    assert draft.props == {
        "UnitType": "Node",
        "MinNodes": "2",
        "MaxNodes": "2",
        "IsExclusive": "True",
        "AutoCalculateMin": "False",
        "AutoCalculateMax": "False",
    }
    assert draft.env == {"A": "1"} and draft.custom == {"C": "3"}
    task = draft.tasks[0]
    assert task.props == {
        "CommandLine": "echo",
        "StdOutFilePath": "o.txt",
        "RequiredNodes": "N1,N2",
        "RuntimeSeconds": "5400",
    }
    assert task.env == {"B": "2"}
    namespaced = parse_job_xml(
        '<?xml version="1.0"?><Job xmlns="http://schemas.microsoft.com/HPCS2008R2/scheduler/" '
        'Version="3.000" AutoCalculateMin="true" MinCores="1">'
        '<Tasks><Task CommandLine="hostname" /></Tasks></Job>'
    )
    assert namespaced.props == {"AutoCalculateMin": "True", "MinCores": "1"}
    assert namespaced.tasks[0].props == {"CommandLine": "hostname"}


@pytest.mark.parametrize(
    "xml",
    [
        '<Job IsExclusive="yes"/>',
        '<Job MinNodes="two"/>',
        '<Job UnitType="Rack"/>',
        "<Job><Tasks><Task Runtime='soon'/></Tasks></Job>",
        "<Job><EnvironmentVariables><Variable><Value>x</Value></Variable></EnvironmentVariables></Job>",
        "<Task/>",
        "<Job>",
    ],
)
def test_bad_values_are_errors(xml: str) -> None:
    with pytest.raises(PropError):
        parse_job_xml(xml)


def test_reference_examples_are_accepted(client: Client) -> None:
    # The copies in the repository, and the examples only the team's reference has, when it is there.
    folders = [REFERENCE / "job-xml-examples", SHARED_REFERENCE / "job-xml-examples"]
    examples = sorted({path.name: path for folder in folders for path in folder.glob("*.xml")}.values())
    assert len(examples) >= 9
    for path in examples:
        response = client.post("/jobs/jobFile", json=path.read_text(encoding="utf-8"))
        assert response.status_code == 200, (path.name, response.text)
