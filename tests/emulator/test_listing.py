"""Lists: nodes the 2016 way (/nodes*) and the 2019 way (/cluster/nodes*), jobs, tasks, and their paging."""

from __future__ import annotations

import time

from hpcjob.emulator import HeadNode

from .conftest import Client, job_xml, task_xml


def test_nodes_2016_style(client: Client, head: HeadNode) -> None:
    online = client.rows("/nodes", **{"$filter": "NodeState eq Online", "properties": "id,name"})
    assert online == [
        {"Id": "1", "Name": "LOCALHOST"},
        {"Id": "2", "Name": "GPU02"},
        {"Id": "4", "Name": "CPU04"},
    ]
    every = client.rows("/nodes")
    assert {"Name", "State", "Health", "NumCores", "NodeGroups"} <= set(every[0])
    assert [(n["Name"], n["State"], n["NumCores"]) for n in every][2:] == [
        ("GPU03", "Offline", "4"),
        ("CPU04", "Online", "8"),
    ]
    node = client.props("/nodes/gpu02")
    assert node["Name"] == "GPU02" and node["Health"] == "OK"
    assert node["NodeGroups"] == "ComputeNodes,LinuxNodes,GPUNodes"
    groups = client.rows("/nodes/groups")
    assert {"Name": "ComputeNodes", "Description": "The compute nodes in the cluster"} in groups
    assert "GPUNodes" in [g["Name"] for g in groups]
    assert client.get("/nodes/groups/GPUNodes").json() == ["LOCALHOST", "GPU02", "GPU03"]
    assert client.get("/nodes/groups/gpunodes").json() == ["LOCALHOST", "GPU02", "GPU03"]
    head.set_node("GPU02", state="Offline")
    online = client.rows("/nodes", **{"$filter": "NodeState eq Online", "properties": "Name"})
    assert [n["Name"] for n in online] == ["LOCALHOST", "CPU04"]
    assert client.get("/nodes", params={"$filter": "NodeHealth eq OK"}).status_code == 400
    assert client.get("/nodes", params={"properties": "Name,Bogus"}).status_code == 400


def test_node_paging_and_sorting_2016_style(client: Client) -> None:
    first = client.get("/nodes", params={"properties": "Name", "rowsPerRead": "2", "startRow": "0"})
    assert first.headers["x-ms-row-count"] == "4"
    assert "x-ms-continuation-queryId" not in first.headers
    assert [r["Properties"][0]["Value"] for r in first.json()] == ["LOCALHOST", "GPU02"]
    last = client.get("/nodes", params={"properties": "Name", "rowsPerRead": "2", "startRow": "3"})
    assert len(last.json()) == 1
    past = client.get("/nodes", params={"rowsPerRead": "2", "startRow": "9"})
    assert (past.json(), past.headers["x-ms-row-count"]) == ([], "4")
    backwards = client.rows("/nodes", properties="Name", sortNodesBy="Id", asc="false")
    assert [n["Name"] for n in backwards] == ["CPU04", "GPU03", "GPU02", "LOCALHOST"]
    by_name = client.rows("/nodes", properties="Name", sortNodesBy="Name")
    assert [n["Name"] for n in by_name] == ["CPU04", "GPU02", "GPU03", "LOCALHOST"]


def test_nodes_2019_style(client: Client, head: HeadNode) -> None:
    gpus = client.get("/cluster/nodes", params={"group": "GPUNodes", "state": "Online"}).json()
    assert [n["Name"] for n in gpus] == ["LOCALHOST", "GPU02"]
    assert gpus[0]["Cores"] == 4 and gpus[0]["Health"] == "OK" and "GPUNodes" in gpus[0]["Groups"]
    assert [n["Name"] for n in client.get("/cluster/nodes").json()] == [
        "LOCALHOST",
        "GPU02",
        "GPU03",
        "CPU04",
    ]
    head.set_node("LOCALHOST", health="Warning")
    healthy = client.get("/cluster/nodes", params={"group": "GPUNodes", "health": "OK"}).json()
    assert [n["Name"] for n in healthy] == ["GPU02", "GPU03"]
    names = client.get("/cluster/nodes", params={"names": "cpu04,GPU02"}).json()
    assert [n["Name"] for n in names] == ["GPU02", "CPU04"]
    assert client.get("/cluster/nodes/localhost").json()["Health"] == "Warning"
    assert client.get("/cluster/nodes", params={"state": "Up"}).status_code == 400
    assert client.get("/cluster/nodes", params={"group": "NoSuchGroup"}).json() == []
    groups = {g["Name"]: g for g in client.get("/cluster/nodeGroups").json()}
    assert groups["ComputeNodes"]["Managed"] is True and groups["GPUNodes"]["Managed"] is False
    assert client.get("/cluster/nodeGroups/gpunodes").json()["Name"] == "GPUNodes"
    assert client.get("/cluster/nodeGroups/GPUNodes/nodes").json() == ["LOCALHOST", "GPU02", "GPU03"]
    # Node operations are done asynchronously (the spec): the state, once made.
    assert client.post("/cluster/nodes/GPU03/operations/bringOnline").status_code == 202
    assert _state_soon(client, "GPU03", "Online")
    assert client.post("/cluster/nodes/GPU03/operations/takeOffline").status_code == 202
    assert _state_soon(client, "GPU03", "Offline")


def _state_soon(client: Client, node: str, wanted: str) -> bool:
    deadline = time.monotonic() + 10
    while client.get(f"/cluster/nodes/{node}").json()["State"] != wanted:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_nodes_of_a_job(client: Client) -> None:
    job_id = client.submit_xml(job_xml(task_xml("sleep 600"), UnitType="Node", RequestedNodes="CPU04"))
    client.wait_task(job_id, 1, ("Running",))
    nodes = client.get("/cluster/nodes", params={"jobs": str(job_id)}).json()
    assert [n["Name"] for n in nodes] == ["CPU04"]
    running = client.get("/jobs", params={"nodeNames": "cpu04"})
    assert [{p["Name"]: p["Value"] for p in j["Properties"]}["Id"] for j in running.json()] == [str(job_id)]
    assert client.post(f"/jobs/{job_id}/cancel").status_code == 204
    assert client.wait(job_id) == "Canceled"


def test_task_list_paging(client: Client) -> None:
    job_id = client.post("/jobs", json=[]).json()
    for number in range(1, 26):
        client.post(f"/jobs/{job_id}/tasks", json=[{"Name": "CommandLine", "Value": f"echo {number}"}])
    # Default: 10 rows and a continuation id while rows remain.
    seen: list[str] = []
    params: dict[str, str] = {"properties": "TaskId,State"}
    pages = 0
    while True:
        page = client.get(f"/jobs/{job_id}/tasks", params=params)
        rows = page.json()
        seen += [r["Properties"][0]["Value"] for r in rows]
        pages += 1
        token = page.headers.get("x-ms-continuation-queryId")
        assert "x-ms-row-count" not in page.headers
        if token is None:
            break
        assert len(rows) == 10
        params = {"queryId": token}
    assert pages == 3
    assert seen == [f"{job_id}.{n}" for n in range(1, 26)]
    assert client.get(f"/jobs/{job_id}/tasks", params={"queryId": "bogus"}).status_code == 400
    # One request can return all of them.
    everything = client.get(f"/jobs/{job_id}/tasks", params={"rowsPerRead": "1000"})
    assert len(everything.json()) == 25 and "x-ms-continuation-queryId" not in everything.headers
    # startRow paging: the total in x-ms-row-count, no continuation.
    tail = client.get(f"/jobs/{job_id}/tasks", params={"startRow": "20", "rowsPerRead": "10"})
    assert len(tail.json()) == 5 and tail.headers["x-ms-row-count"] == "25"
    assert "x-ms-continuation-queryId" not in tail.headers
    default = client.rows(f"/jobs/{job_id}/tasks", startRow="0")
    assert len(default) == 10
    assert list(default[0]) == [
        "TaskId",
        "Name",
        "State",
        "CommandLine",
        "ExitCode",
        "ParentJobId",
        "JobTaskId",
        "InstanceId",
    ]
    backwards = client.rows(
        f"/jobs/{job_id}/tasks", properties="JobTaskId", sortTasksBy="TaskId", asc="false", rowsPerRead="3"
    )
    assert [r["JobTaskId"] for r in backwards] == ["25", "24", "23"]
    configuring = client.get(
        f"/jobs/{job_id}/tasks", params={"$filter": "TaskState eq Configuring", "rowsPerRead": "100"}
    )
    assert len(configuring.json()) == 25
    some = client.rows(f"/jobs/{job_id}/tasks", **{"$filter": "TaskIds eq 3,5", "properties": "JobTaskId"})
    assert some == [{"JobTaskId": "3"}, {"JobTaskId": "5"}]
    assert client.get(f"/jobs/{job_id}/tasks", params={"$filter": "State eq Running"}).status_code == 400
    assert client.get(f"/jobs/{job_id}/tasks", params={"rowsPerRead": "0"}).status_code == 400


def test_failed_tasks_by_filter(client: Client) -> None:
    job_id = client.submit_xml(
        job_xml(*(task_xml(c) for c in ("echo a", "echo b", "echo c", "thiscommanddoesnotexist")))
    )
    assert client.wait(job_id) == "Failed"
    failed = client.rows(
        f"/jobs/{job_id}/tasks", **{"$filter": "TaskState eq Failed", "properties": "TaskId,ExitCode"}
    )
    assert failed == [{"TaskId": f"{job_id}.4", "ExitCode": "127"}]
    assert client.get(f"/jobs/{job_id}/tasks/5").status_code == 404


def test_job_list(client: Client, head: HeadNode) -> None:
    ids = [client.post("/jobs", json=[{"Name": "Name", "Value": f"job-{n}"}]).json() for n in range(4)]
    bobs = client.post(
        "/jobs", json=[{"Name": "Name", "Value": "bobs"}], headers={"x-ms-as-user": "bob"}
    ).json()
    assert client.post(f"/jobs/{ids[0]}/cancel").status_code == 204
    default = client.rows("/jobs")
    assert list(default[0]) == ["Id", "Owner", "Name", "State", "Priority"]
    assert [j["Id"] for j in default] == [str(i) for i in [*ids, bobs]]
    # Look a job up by its unique name, as a client does after a create that timed out.
    named = [
        j for j in client.rows("/jobs", properties="Id,Name", rowsPerRead="1000") if j["Name"] == "job-2"
    ]
    assert named == [{"Id": str(ids[2]), "Name": "job-2"}]
    configuring = client.rows("/jobs", **{"$filter": "JobState eq Configuring", "properties": "Id"})
    assert [j["Id"] for j in configuring] == [str(i) for i in [*ids[1:], bobs]]
    canceled = client.rows("/jobs", **{"$filter": "jobstate eq canceled", "properties": "Id,State"})
    assert canceled == [{"Id": str(ids[0]), "State": "Canceled"}]
    assert [j["Name"] for j in client.rows("/jobs", owner="bob")] == ["bobs"]
    assert [j["Name"] for j in client.rows("/jobs", owner="HPC\\alice")] == [f"job-{n}" for n in range(4)]
    page = client.get("/jobs", params={"rowsPerRead": "3", "properties": "Id"})
    assert len(page.json()) == 3
    rest = client.get(
        "/jobs", params={"queryId": page.headers["x-ms-continuation-queryId"], "rowsPerRead": "3"}
    )
    assert [r["Properties"] for r in rest.json()] == [
        [{"Name": "Id", "Value": str(i)}] for i in [*ids[3:], bobs]
    ]
    assert "x-ms-continuation-queryId" not in rest.headers
    counted = client.get("/jobs", params={"startRow": "1", "rowsPerRead": "2"})
    assert counted.headers["x-ms-row-count"] == "5" and len(counted.json()) == 2
    newest_first = client.rows("/jobs", properties="Id", sortJobsBy="id", asc="False")
    assert [j["Id"] for j in newest_first] == [str(i) for i in reversed([*ids, bobs])]
    assert client.get("/jobs", params={"$filter": "JobState eq Sleeping"}).status_code == 400
    assert client.get("/jobs", params={"properties": "Password"}).status_code == 400
