"""Transport and plain endpoints: TLS, Basic auth, cluster info, bodies, properties, permissions."""

from __future__ import annotations

import re
import ssl
import urllib.request

import pytest
import requests

from hpcjob.emulator import DEFAULT_NODES, HeadNode, resolves

from .conftest import PASSWORD, Client
from .spec_check import SpecMismatch, check


def test_basic_auth_is_required(head: HeadNode, client: Client) -> None:
    url = head.url + "/cluster/version"
    for auth in (None, ("alice", "wrong"), ("mallory", PASSWORD), ("alice", "")):
        response = requests.get(url, auth=auth, verify=head.ca_file, timeout=5)
        assert response.status_code == 401, auth
        assert response.headers["WWW-Authenticate"].startswith("Basic")
        assert response.text
        assert PASSWORD not in response.text
    assert client.get("/cluster/version").status_code == 200
    # User names match case-insensitively, passwords do not.
    assert Client(head, "ALICE").get("/cluster/version").status_code == 200
    assert Client(head, "alice", PASSWORD.upper()).get("/cluster/version").status_code == 401


def test_certificate_is_valid_for_loopback_names(head: HeadNode) -> None:
    context = ssl.create_default_context(cafile=head.ca_file)
    auth = "Basic " + __import__("base64").b64encode(f"alice:{PASSWORD}".encode()).decode()
    for host in ("127.0.0.1", "localhost"):
        url = head.url.replace("127.0.0.1", host) + "/cluster/version"
        request = urllib.request.Request(url, headers={"Authorization": auth})
        with urllib.request.urlopen(request, context=context, timeout=5) as answer:
            assert answer.status == 200
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(head.url + "/cluster/version", verify=True, timeout=5)


def test_cluster_information(client: Client) -> None:
    version = client.get("/cluster/version")
    assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", version.json())
    assert re.fullmatch(r'"\d+\.\d+\.\d+\.\d+"', version.text)
    assert client.get("/cluster/activeHeadNode").json() == "HEADNODE"
    assert client.get("/cluster/info/dateTimeFormat").json() == "M/d/yyyy h:mm:ss tt"
    assert client.get("/cluster/userRoles").json() == ["User", "Administrator"]
    assert Client(client.head, "bob", "bob-pw").get("/cluster/userRoles").json() == ["User"]
    assert client.get("/jobs/templates").json() == ["Default"]
    # Paths match case-insensitively, like the head node's web stack.
    assert client.get("/Cluster/Version").status_code == 200


def test_unknown_resources_answer_404_with_a_message(client: Client) -> None:
    for path in (
        "/jobs/999",
        "/jobs/999/tasks",
        "/nodes/NOSUCHNODE",
        "/cluster/nodes/NOSUCHNODE",
        "/nodes/groups/NoSuchGroup",
        "/cluster/nodeGroups/NoSuchGroup",
    ):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.headers["Content-Type"].startswith("text/plain")
        assert response.text
    job_id = client.post("/jobs", json=[]).json()
    assert client.get(f"/jobs/{job_id}/tasks/1").status_code == 404
    assert client.post("/jobs/999/submit").status_code == 404
    assert client.get("/no/such/path", spec=False).status_code == 404
    assert client.request("DELETE", "/jobs/1", spec=False).status_code == 405


def test_create_job_from_properties_then_tasks(client: Client, head: HeadNode) -> None:
    created = client.post(
        "/jobs",
        json=[
            {"Name": "Name", "Value": "from-props"},
            {"name": "unittype", "value": "2"},
            {"Name": "Priority", "Value": "0"},
        ],
    )
    assert created.status_code == 200
    job_id = created.json()
    job = client.props(f"/jobs/{job_id}", properties="id,name,State,UnitType,Priority,Owner")
    assert list(job) == ["Id", "Name", "State", "UnitType", "Priority", "Owner"]  # canonical, in order
    assert job == {
        "Id": str(job_id),
        "Name": "from-props",
        "State": "Configuring",
        "UnitType": "Node",
        "Priority": "Lowest",
        "Owner": "HPC\\alice",
    }
    for number, command in ((1, "echo one"), (2, "echo two")):
        added = client.post(f"/jobs/{job_id}/tasks", json=[{"Name": "CommandLine", "Value": command}])
        assert added.status_code == 200
        assert added.json() == number
    assert client.props(f"/jobs/{job_id}/tasks/2")["State"] == "Configuring"
    assert client.put(f"/jobs/{job_id}", json=[{"name": "Name", "value": "renamed"}]).status_code == 204
    assert client.post(f"/jobs/{job_id}/submit").status_code == 204
    assert client.wait(job_id) == "Finished"
    tasks = client.rows(
        f"/jobs/{job_id}/tasks", properties="TaskId,State,ExitCode,Output,JobTaskId,InstanceId"
    )
    assert tasks == [
        {
            "TaskId": f"{job_id}.1",
            "State": "Finished",
            "ExitCode": "0",
            "Output": "one\n",
            "JobTaskId": "1",
            "InstanceId": "0",
        },
        {
            "TaskId": f"{job_id}.2",
            "State": "Finished",
            "ExitCode": "0",
            "Output": "two\n",
            "JobTaskId": "2",
            "InstanceId": "0",
        },
    ]
    job = client.props(f"/jobs/{job_id}")
    assert job["Name"] == "renamed"
    assert "Password" not in job
    assert head.job_history(job_id) == [
        "Configuring",
        "Submitted",
        "Validating",
        "Queued",
        "Running",
        "Finished",
    ]
    assert head.task_history(job_id, 1) == [
        "Configuring",
        "Submitted",
        "Queued",
        "Dispatching",
        "Running",
        "Finished",
    ]
    # Ended jobs cannot change.
    assert client.put(f"/jobs/{job_id}", json=[{"Name": "Name", "Value": "late"}]).status_code == 400
    assert client.post(f"/jobs/{job_id}/submit").status_code == 400


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ([{"Name": "NoSuchProperty", "Value": "1"}], 400, "NoSuchProperty"),
        ([{"Name": "State", "Value": "Running"}], 400, "read-only"),
        ([{"Name": "MinNodes", "Value": 2}], 400, "string"),
        ([{"Name": "MinNodes", "Value": "two"}], 400, "integer"),
        ([{"Name": "IsExclusive", "Value": "yes"}], 400, "Boolean"),
        ([{"Name": "UnitType", "Value": "Rack"}], 400, "UnitType"),
        ([{"Value": "x"}], 400, "Name"),
        ({"Name": "Name", "Value": "x"}, 400, "array"),
        ("not properties", 400, "array"),
    ],
)
def test_bad_properties_answer_400(client: Client, body: object, status: int, message: str) -> None:
    response = client.post("/jobs", json=body)
    assert response.status_code == status
    assert message in response.text


def test_bodies_must_be_json(client: Client) -> None:
    xml = "<Job><Tasks><Task CommandLine='hostname' /></Tasks></Job>"
    raw = client.post("/jobs/jobFile", data=xml, headers={"Content-Type": "application/xml"})
    assert raw.status_code == 415
    not_json = client.post("/jobs/jobFile", data=xml, headers={"Content-Type": "application/json"})
    assert not_json.status_code == 400
    not_a_string = client.post("/jobs/jobFile", json={"xml": xml})
    assert not_a_string.status_code == 400
    assert "JSON string" in not_a_string.text
    assert client.post("/jobs/jobFile", json="<Job><Tasks></Job>").status_code == 400
    assert client.post("/jobs/jobFile", json="<Jobs/>").status_code == 400
    assert client.post("/jobs/jobFile", json=xml).status_code == 200


def test_command_line_limit(client: Client) -> None:
    job_id = client.post("/jobs", json=[]).json()
    too_long = client.post(f"/jobs/{job_id}/tasks", json=[{"Name": "CommandLine", "Value": "x" * 481}])
    assert too_long.status_code == 400
    assert "480" in too_long.text
    ok = client.post(f"/jobs/{job_id}/tasks", json=[{"Name": "CommandLine", "Value": "x" * 480}])
    assert ok.status_code == 200


def test_environment_variables_and_custom_properties(client: Client) -> None:
    job_id = client.post("/jobs", json=[]).json()
    task_id = client.post(
        f"/jobs/{job_id}/tasks", json=[{"Name": "CommandLine", "Value": "echo $A $B $C"}]
    ).json()
    pairs = [{"Name": "A", "Value": "job-a"}, {"Name": "B", "Value": "job-b"}]
    assert client.post(f"/jobs/{job_id}/envVariables", json=pairs).status_code == 204
    task_env = [{"Name": "B", "Value": "task-b"}]
    assert client.post(f"/jobs/{job_id}/tasks/{task_id}/envVariables", json=task_env).status_code == 204
    custom = [{"Name": "C", "Value": "custom"}]
    assert client.post(f"/jobs/{job_id}/customProperties", json=custom).status_code == 204
    assert client.props(f"/jobs/{job_id}/envVariables", names="A,Missing") == {"A": "job-a", "Missing": ""}
    assert client.props(f"/jobs/{job_id}/envVariables") == {"A": "job-a", "B": "job-b"}
    assert client.props(f"/jobs/{job_id}/customProperties") == {"C": "custom"}
    assert client.props(f"/jobs/{job_id}/tasks/{task_id}/envVariables") == {"B": "task-b"}
    assert client.post(f"/jobs/{job_id}/submit").status_code == 204
    assert client.wait(job_id) == "Finished"
    # Job env reaches the task, task env wins over it, custom properties are not environment.
    assert client.props(f"/jobs/{job_id}/tasks/{task_id}", properties="Output")["Output"] == "job-a task-b\n"


def test_acting_as_another_user(head: HeadNode, client: Client) -> None:
    as_bob = client.post("/jobs", json=[], headers={"x-ms-as-user": "bob"})
    assert client.props(f"/jobs/{as_bob.json()}", properties="Owner")["Owner"] == "HPC\\bob"
    bob = Client(head, "bob", "bob-pw")
    assert bob.post("/jobs", json=[], headers={"x-ms-as-user": "alice"}).status_code == 403
    alices = client.post("/jobs", json=[]).json()
    assert bob.post(f"/jobs/{alices}/cancel", json="not mine").status_code == 403
    assert bob.put(f"/jobs/{alices}", json=[{"Name": "Name", "Value": "x"}]).status_code == 403
    assert client.post(f"/jobs/{alices}/cancel").status_code == 204
    bobs = bob.post("/jobs", json=[]).json()
    assert bob.post(f"/jobs/{bobs}/cancel").status_code == 204


def test_error_bodies_as_json_faults(make_head) -> None:  # type: ignore[no-untyped-def]
    head = make_head(error_format="json")
    response = Client(head).get("/jobs/42")
    assert response.status_code == 404
    assert response.json() == {"Code": 404, "Message": "The job 42 was not found.", "Values": None}


def test_the_spec_check_catches_mismatches() -> None:
    check("GET", "/hpc/jobs/1", 200, b'[{"Name": "Id", "Value": "1"}]', "application/json")
    with pytest.raises(SpecMismatch):
        check("GET", "/hpc/jobs/1", 200, b'[{"Name": "Id", "Value": 1}]', "application/json")
    with pytest.raises(SpecMismatch):
        check("POST", "/hpc/jobs/1/submit", 200, b"", "")
    with pytest.raises(SpecMismatch):
        check("POST", "/hpc/jobs/jobFile", 200, b'"1"', "application/json")
    with pytest.raises(SpecMismatch):
        check("GET", "/hpc/cluster/nodes", 200, b'[{"Name": "N", "State": "Up"}]', "application/json")
    with pytest.raises(SpecMismatch):
        check("GET", "/hpc/jobs/1", 404, b"", "")
    check("GET", "/hpc/nodes/groups/G", 200, b'["A"]', "application/json")  # 2016 spec for /nodes*


def test_default_nodes() -> None:
    assert [n.name for n in DEFAULT_NODES] == ["LOCALHOST", "NODE002", "NODE003", "NODE004"]
    assert resolves(DEFAULT_NODES[0].name)  # the rendezvous node of a job that takes the first nodes
    with HeadNode(users={"alice": PASSWORD}) as head:
        client = Client(head)
        online_gpus = client.get("/cluster/nodes", params={"group": "GPUNodes", "state": "Online"}).json()
        assert [n["Name"] for n in online_gpus] == ["LOCALHOST", "NODE002", "NODE003"]
        assert client.get("/cluster/nodes/NODE004").json()["Groups"] == ["ComputeNodes", "LinuxNodes"]
