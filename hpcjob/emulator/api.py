"""The REST endpoints of the emulated head node: paths, bodies and status codes of the HPC Pack spec.

``reference/hpcpack-rest-api/hpcpack.yaml`` (2019, basePath ``/hpc``) for everything but ``/nodes*``,
which follows ``2016/hpcpack.yaml``. Bodies are JSON: RestProperty arrays ``[{"Name", "Value"}]`` with
string values (the keys ``Name``/``Value`` and the property names match case-insensitively on input),
list GETs answer ``[{"Properties": [...]}]``. Create answers 200 with the new id, submit/cancel/set 204,
an unknown job/task/node 404, bad input 400, each error with a human message. Paths match
case-insensitively (the head node's web stack does).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

from hpcjob.emulator import props as P
from hpcjob.emulator.base import Actor, ApiError
from hpcjob.emulator.cluster import Cluster
from hpcjob.emulator.jobs import Job, Task
from hpcjob.emulator.nodes import NODE_HEALTHS, NODE_STATES, Node

NO_BODY = object()
QUERY_LIFETIME_S = 3600.0  # continuation rowsets live 60 minutes (CHANGELOG 2016 U3 QFE)
JOB_LIST_DEFAULT = "Id,Owner,Name,State,Priority"
TASK_LIST_DEFAULT = "TaskId,Name,State,CommandLine,ExitCode,ParentJobId,JobTaskId,InstanceId"
NODE_PROPS = (
    "Id", "Name", "State", "Health", "Availability", "Location", "OnlineTime", "OfflineTime", "NodeGroups",
    "NumCores", "NumSockets", "MemorySize", "Reachable", "CpuSpeed", "DnsSuffix", "Guid", "JobType",
    "MoveToOffline",
)  # fmt: skip


@dataclass
class Reply:
    status: int
    body: Any = NO_BODY
    headers: dict[str, str] = field(default_factory=dict)
    text: bool = False  # body is a plain-text message (errors), not JSON
    content_type: str | None = None  # of a text body other than a plain message (a SOAP envelope)


@dataclass
class Request:
    method: str
    path: str  # below the base path, e.g. /jobs/3
    query: Mapping[str, str]  # lower-case names, last value wins
    body: bytes
    content_type: str
    actor: Actor


Handler = Callable[["Api", Request, Mapping[str, str]], Reply]
_ROUTES: list[tuple[str, re.Pattern[str], Handler]] = []


def route(method: str, pattern: str) -> Callable[[Handler], Handler]:
    def register(func: Handler) -> Handler:
        _ROUTES.append((method, re.compile(f"{pattern}/?", re.IGNORECASE), func))
        return func

    return register


class _Queries:
    """Rowsets kept for ``x-ms-continuation-queryId`` paging."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, tuple[list[Any], int, list[str] | None, float]] = {}

    def put(self, rows: list[Any], position: int, names: list[str] | None) -> str:
        token = secrets.token_urlsafe(12)
        with self._lock:
            clock = time.monotonic()
            self._rows = {k: v for k, v in self._rows.items() if v[3] > clock}
            self._rows[token] = (rows, position, names, clock + QUERY_LIFETIME_S)
        return token

    def take(self, token: str) -> tuple[list[Any], int, list[str] | None]:
        with self._lock:
            found = self._rows.pop(token, None)
        if found is None or found[3] < time.monotonic():
            raise ApiError(400, f"The query id {token} is not valid or has expired.")
        return found[0], found[1], found[2]


class Api:
    """The REST front door: requests below /hpc."""

    base_path = "/hpc"
    auth_schemes: tuple[str, ...] = ("Basic",)

    def __init__(self, cluster: Cluster, *, version: str, head_name: str) -> None:
        self.cluster = cluster
        self.version = version
        self.head_name = head_name
        self.queries = _Queries()

    def handle(self, request: Request) -> Reply:
        allowed: list[str] = []
        for method, pattern, func in _ROUTES:
            match = pattern.fullmatch(request.path)
            if match is None:
                continue
            if method != request.method:
                allowed.append(method)
                continue
            params = {k: unquote(v) for k, v in match.groupdict().items()}
            return func(self, request, params)
        if allowed:
            return Reply(
                405,
                f"The requested resource does not support the HTTP method '{request.method}'.",
                {"Allow": ", ".join(sorted(set(allowed)))},
            )
        raise ApiError(404, f"No HTTP resource was found that matches the request URI '{request.path}'.")

    # ------------------------------------------------------------------------------------ cluster

    @route("GET", "/cluster/version")
    def version_(self, req: Request, params: Mapping[str, str]) -> Reply:
        return Reply(200, self.version)

    @route("GET", "/cluster/activeHeadNode")
    def active_head(self, req: Request, params: Mapping[str, str]) -> Reply:
        return Reply(200, self.head_name)

    @route("GET", "/cluster/info/dateTimeFormat")
    def date_format(self, req: Request, params: Mapping[str, str]) -> Reply:
        return Reply(200, "M/d/yyyy h:mm:ss tt")

    @route("GET", "/cluster/userRoles")
    def user_roles(self, req: Request, params: Mapping[str, str]) -> Reply:
        return Reply(200, ["User", "Administrator"] if req.actor.admin else ["User"])

    # ------------------------------------------------------------------------- nodes, 2019 style

    def _typed_node(self, node: Node) -> dict[str, Any]:
        linux = node.in_group("LinuxNodes")
        roles = ["LinuxNode"] if linux else ["ComputeNode"]
        return {
            "Name": node.name,
            "State": node.state,
            "Health": node.health,
            "Template": "LinuxNode Template" if linux else "Default ComputeNode Template",
            "Location": None,
            "MemorySize": node.memory_mb,
            "Cores": node.cores,
            "Sockets": node.sockets,
            "HpcPackVersion": self.version,
            "OnAzure": False,
            "Groups": list(node.groups),
            "Roles": ["ComputeNode"],
            "InstalledServiceRoles": roles,
            "ActiveServiceRoles": roles if node.state == "Online" else [],
        }

    @route("GET", "/cluster/nodes")
    def cluster_nodes(self, req: Request, params: Mapping[str, str]) -> Reply:
        with self.cluster.lock:
            nodes = list(self.cluster.nodes.values())
            if req.query.get("names"):
                wanted = {n.lower() for n in P.split_list(req.query["names"])}
                nodes = [n for n in nodes if n.name.lower() in wanted]
            if req.query.get("jobs"):
                held: set[str] = set()
                for job_id in P.split_list(req.query["jobs"]):
                    if not job_id.isdigit():
                        raise ApiError(400, f"The job id {job_id} is not an integer.")
                    job = self.cluster.jobs.get(int(job_id))
                    held.update(n.lower() for n in (job.allocation if job else ()))
                nodes = [n for n in nodes if n.name.lower() in held]
            if req.query.get("group"):
                nodes = [n for n in nodes if n.in_group(req.query["group"])]
            if req.query.get("state"):
                state = _enum(req.query["state"], NODE_STATES, "state")
                nodes = [n for n in nodes if n.state == state]
            if req.query.get("health"):
                health = _enum(req.query["health"], NODE_HEALTHS, "health")
                nodes = [n for n in nodes if n.health == health]
            return Reply(200, [self._typed_node(n) for n in nodes])

    @route("GET", "/cluster/nodes/(?P<name>[^/]+)")
    def cluster_node(self, req: Request, params: Mapping[str, str]) -> Reply:
        with self.cluster.lock:
            return Reply(200, self._typed_node(self.cluster.node(params["name"])))

    @route("POST", "/cluster/nodes/(?P<name>[^/]+)/operations/(?P<op>[^/]+)")
    def node_operation(self, req: Request, params: Mapping[str, str]) -> Reply:
        """202 Accepted, done asynchronously: "The caller has to query the node state for the operation
        result" (the spec). takeOffline has no force in the spec: a node that a job holds drains. Only
        an administrator may (Set-HpcNodeState's page; the REST door's words are the emulator's own)."""
        node = self.cluster.node(params["name"])
        op = params["op"].lower()
        if op not in ("bringonline", "takeoffline", "start", "stop", "reboot", "shutdown"):
            raise ApiError(400, f"The node operation {params['op']} does not exist.")
        if not req.actor.admin:
            raise ApiError(
                403, f"The user {req.actor.name} must be a cluster administrator to operate a node."
            )
        if op in ("start", "stop", "reboot", "shutdown"):
            raise ApiError(400, f"The emulator does not support the node operation {params['op']}.")
        self.cluster.set_node_state(node.name, "Online" if op == "bringonline" else "Offline")
        return Reply(202)

    @route("GET", "/cluster/nodeGroups")
    def cluster_groups(self, req: Request, params: Mapping[str, str]) -> Reply:
        with self.cluster.lock:
            groups = self.cluster.groups()
        return Reply(200, [{"Name": n, "Description": d, "Managed": m} for n, (d, m) in groups.items()])

    @route("POST", "/cluster/nodeGroups")
    def create_group(self, req: Request, params: Mapping[str, str]) -> Reply:
        body = _json_object(req)
        self._admin(req, "create a node group")
        with self.cluster.lock:
            name, text, managed = self.cluster.create_group(
                str(body.get("Name") or ""), str(body.get("Description") or "")
            )
        return Reply(200, {"Name": name, "Description": text, "Managed": managed})

    @route("PATCH", "/cluster/nodeGroups/(?P<name>[^/]+)/nodes")
    def move_group_nodes(self, req: Request, params: Mapping[str, str]) -> Reply:
        body = _json_object(req)
        self._admin(req, "move nodes of a node group")
        names = body.get("NodeNames")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ApiError(400, "NodeNames must be a list of node names.")
        with self.cluster.lock:
            return Reply(
                200, self.cluster.move_nodes(params["name"], str(body.get("Operation") or ""), names)
            )

    @staticmethod
    def _admin(req: Request, what: str) -> None:
        if not req.actor.admin:
            raise ApiError(403, f"The user {req.actor.name} must be a cluster administrator to {what}.")

    @route("GET", "/cluster/nodeGroups/(?P<name>[^/]+)")
    def cluster_group(self, req: Request, params: Mapping[str, str]) -> Reply:
        with self.cluster.lock:
            name, text, managed = self.cluster.group(params["name"])
        return Reply(200, {"Name": name, "Description": text, "Managed": managed})

    @route("GET", "/cluster/nodeGroups/(?P<name>[^/]+)/nodes")
    def cluster_group_nodes(self, req: Request, params: Mapping[str, str]) -> Reply:
        with self.cluster.lock:
            return Reply(200, self.cluster.group_members(params["name"]))

    # ------------------------------------------------------------------------- nodes, 2016 style

    def _node_props(self, node: Node) -> dict[str, str]:
        return {
            "Id": str(node.id),
            "Name": node.name,
            "State": node.state,
            "Health": node.health,
            "Availability": "AlwaysOn",
            "Location": "OnPremise",
            "OnlineTime": P.format_time(node.online_time),
            "OfflineTime": P.format_time(node.offline_time),
            "NodeGroups": ",".join(node.groups),
            "NumCores": str(node.cores),
            "NumSockets": str(node.sockets),
            "MemorySize": str(node.memory_mb),
            "Reachable": str(node.health != "Error" and not node.unreachable),
            "CpuSpeed": "2400",
            "DnsSuffix": "",
            "Guid": f"00000000-0000-4000-8000-{node.id:012d}",
            "JobType": "Batch, Admin",
            "MoveToOffline": "False",
        }

    @route("GET", "/nodes")
    def nodes(self, req: Request, params: Mapping[str, str]) -> Reply:
        names = _plain_names(req.query.get("properties"), NODE_PROPS)
        with self.cluster.lock:
            rows = [self._node_props(n) for n in self.cluster.nodes.values()]
        for _, value in _filters(req.query.get("$filter"), ("NodeState",)):
            state = _enum(value, NODE_STATES, "NodeState")
            rows = [r for r in rows if r["State"] == state]
        rows = _sorted(
            rows, req.query.get("sortnodesby"), "Id", req.query, NODE_PROPS, lambda r, n: str(r[n])
        )
        return self._paged(req, rows, names, lambda row, wanted: [(n, row[n]) for n in wanted or NODE_PROPS])

    @route("GET", "/nodes/groups")
    def node_groups(self, req: Request, params: Mapping[str, str]) -> Reply:
        with self.cluster.lock:
            groups = self.cluster.groups()
        return Reply(200, [_object([("Name", n), ("Description", d)]) for n, (d, _) in groups.items()])

    @route("GET", "/nodes/groups/(?P<name>[^/]+)")
    def node_group(self, req: Request, params: Mapping[str, str]) -> Reply:
        with self.cluster.lock:
            return Reply(200, self.cluster.group_members(params["name"]))

    @route("GET", "/nodes/(?P<name>[^/]+)")
    def node(self, req: Request, params: Mapping[str, str]) -> Reply:
        with self.cluster.lock:
            return Reply(200, _props(self._node_props(self.cluster.node(params["name"])).items()))

    # ----------------------------------------------------------------------------------------- jobs

    @route("GET", "/jobs/templates")
    def templates(self, req: Request, params: Mapping[str, str]) -> Reply:
        return Reply(200, ["Default"])

    @route("POST", "/jobs")
    def create_job(self, req: Request, params: Mapping[str, str]) -> Reply:
        return Reply(200, self.cluster.create_job(req.actor, _properties(req, optional=True)))

    @route("POST", "/jobs/jobFile")
    def create_job_file(self, req: Request, params: Mapping[str, str]) -> Reply:
        xml = _json_string(req, optional=False)
        assert xml is not None
        return Reply(200, self.cluster.create_job_from_xml(req.actor, xml))

    @route("GET", "/jobs")
    def list_jobs(self, req: Request, params: Mapping[str, str]) -> Reply:
        q = req.query
        node_names = P.split_list(q["nodenames"]) if "nodenames" in q else None
        states: set[str] | None = None
        group: str | None = None
        since: dt.datetime | None = None
        if node_names is None:
            for name, value in _filters(q.get("$filter"), ("JobState", "NodeGroup", "ChangeTimeFrom")):
                if name == "JobState":
                    states = {_enum(v, P.JOB_STATES, "JobState") for v in P.split_list(value)}
                elif name == "NodeGroup":
                    group = value
                else:
                    since = _time(value)
        with self.cluster.lock:
            jobs = self.cluster.list_jobs(
                owner=None if node_names is not None else q.get("owner"),
                states=states,
                group=group,
                changed_since=since,
                node_names=node_names,
            )
            if node_names is not None:
                return Reply(200, [_object(_job_values(j, None)) for j in jobs])
            known = [p.name for p in P.JOB_PROPS if not p.secret]
            jobs = _sorted(jobs, q.get("sortjobsby"), "Id", q, known, job_value)
        names = _names(q.get("properties", JOB_LIST_DEFAULT), P.JOB_BY_KEY, "job")
        return self._paged(req, jobs, names, _job_values)

    @route("GET", r"/jobs/(?P<job>\d+)")
    def get_job(self, req: Request, params: Mapping[str, str]) -> Reply:
        names = _names(req.query.get("properties"), P.JOB_BY_KEY, "job")
        with self.cluster.lock:
            return Reply(200, _props(_job_values(self.cluster.job(int(params["job"])), names)))

    @route("PUT", r"/jobs/(?P<job>\d+)")
    def set_job(self, req: Request, params: Mapping[str, str]) -> Reply:
        self.cluster.set_job(req.actor, int(params["job"]), _properties(req, optional=False))
        return Reply(204)

    @route("GET", r"/jobs/(?P<job>\d+)/(?P<kind>envVariables|customProperties)")
    def get_job_pairs(self, req: Request, params: Mapping[str, str]) -> Reply:
        return self._get_pairs(req, int(params["job"]), None, params["kind"])

    @route("POST", r"/jobs/(?P<job>\d+)/(?P<kind>envVariables|customProperties)")
    def set_job_pairs(self, req: Request, params: Mapping[str, str]) -> Reply:
        kind = "env" if params["kind"].lower() == "envvariables" else "custom"
        self.cluster.set_pairs(
            req.actor, int(params["job"]), None, kind, _properties(req, optional=False, nulls=True)
        )
        return Reply(204)

    @route("POST", r"/jobs/(?P<job>\d+)/(?P<op>submit|cancel|finish|requeue)")
    def job_operation(self, req: Request, params: Mapping[str, str]) -> Reply:
        job_id, op = int(params["job"]), params["op"].lower()
        if op == "submit":
            self.cluster.submit(req.actor, job_id, _properties(req, optional=True))
        elif op == "cancel":
            self.cluster.cancel_job(req.actor, job_id, _json_string(req), _forced(req))
        elif op == "finish":
            self.cluster.finish_job(req.actor, job_id, _json_string(req))
        else:
            self.cluster.requeue_job(req.actor, job_id)
        return Reply(204)

    # ---------------------------------------------------------------------------------------- tasks

    @route("GET", r"/jobs/(?P<job>\d+)/tasks")
    def list_tasks(self, req: Request, params: Mapping[str, str]) -> Reply:
        q = req.query
        if q.get("expandparametric", "true").lower() not in ("true", "false"):
            raise ApiError(400, "expandParametric must be true or false.")
        with self.cluster.lock:
            tasks = list(self.cluster.job(int(params["job"])).tasks)
            for name, value in _filters(
                q.get("$filter"), ("TaskState", "TaskStates", "TaskIds", "TaskInstanceIds", "ChangeTimeFrom")
            ):
                if name in ("TaskState", "TaskStates"):
                    states = {_enum(v, P.TASK_STATES, name) for v in P.split_list(value)}
                    tasks = [t for t in tasks if t.state in states]
                elif name == "TaskIds":
                    ids = {_int(v, name) for v in P.split_list(value)}
                    tasks = [t for t in tasks if t.number in ids]
                elif name == "TaskInstanceIds":
                    ids = {_int(v, name) for v in P.split_list(value)}
                    tasks = [t for t in tasks if 0 in ids]  # basic tasks have instance 0
                else:
                    since = _time(value)
                    tasks = [t for t in tasks if P.parse_time(t.props["ChangeTime"]) >= since]
            tasks = _sorted(
                tasks, q.get("sorttasksby"), "TaskId", q, [p.name for p in P.TASK_PROPS], task_value
            )
        names = _names(q.get("properties", TASK_LIST_DEFAULT), P.TASK_BY_KEY, "task")
        return self._paged(req, tasks, names, _task_values)

    @route("POST", r"/jobs/(?P<job>\d+)/tasks")
    def add_task(self, req: Request, params: Mapping[str, str]) -> Reply:
        return Reply(
            200, self.cluster.add_task(req.actor, int(params["job"]), _properties(req, optional=True))
        )

    @route("GET", r"/jobs/(?P<job>\d+)/tasks/(?P<task>\d+)")
    def get_task(self, req: Request, params: Mapping[str, str]) -> Reply:
        names = _names(req.query.get("properties"), P.TASK_BY_KEY, "task")
        with self.cluster.lock:
            task = self.cluster.task(int(params["job"]), int(params["task"]))
            return Reply(200, _props(_task_values(task, names)))

    @route("PUT", r"/jobs/(?P<job>\d+)/tasks/(?P<task>\d+)")
    def set_task(self, req: Request, params: Mapping[str, str]) -> Reply:
        pairs = _properties(req, optional=False)
        self.cluster.set_task(req.actor, int(params["job"]), int(params["task"]), pairs)
        return Reply(204)

    @route("GET", r"/jobs/(?P<job>\d+)/tasks/(?P<task>\d+)/(?P<kind>envVariables|customProperties)")
    def get_task_pairs(self, req: Request, params: Mapping[str, str]) -> Reply:
        return self._get_pairs(req, int(params["job"]), int(params["task"]), params["kind"])

    @route("POST", r"/jobs/(?P<job>\d+)/tasks/(?P<task>\d+)/(?P<kind>envVariables|customProperties)")
    def set_task_pairs(self, req: Request, params: Mapping[str, str]) -> Reply:
        kind = "env" if params["kind"].lower() == "envvariables" else "custom"
        pairs = _properties(req, optional=False, nulls=True)
        self.cluster.set_pairs(req.actor, int(params["job"]), int(params["task"]), kind, pairs)
        return Reply(204)

    @route("POST", r"/jobs/(?P<job>\d+)/tasks/(?P<task>\d+)/(?P<op>cancel|finish|requeue)")
    def task_operation(self, req: Request, params: Mapping[str, str]) -> Reply:
        job_id, task_id, op = int(params["job"]), int(params["task"]), params["op"].lower()
        if op == "cancel":
            self.cluster.cancel_task(req.actor, job_id, task_id, _json_string(req), _forced(req))
        elif op == "finish":
            self.cluster.finish_task(req.actor, job_id, task_id, _json_string(req))
        else:
            self.cluster.requeue_task(req.actor, job_id, task_id)
        return Reply(204)

    # -------------------------------------------------------------------------------------- helpers

    def _get_pairs(self, req: Request, job_id: int, task_id: int | None, kind: str) -> Reply:
        names = P.split_list(req.query["names"]) if req.query.get("names") else None
        which = "env" if kind.lower() == "envvariables" else "custom"
        return Reply(200, _props(self.cluster.get_pairs(job_id, task_id, which, names)))

    def _paged(
        self,
        req: Request,
        rows: list[Any],
        names: list[str] | None,
        render: Callable[[Any, Sequence[str] | None], Iterable[tuple[str, str]]],
    ) -> Reply:
        """Section 2.3: ``startRow`` pages with ``x-ms-row-count``; otherwise ``rowsPerRead`` rows (10 by
        default) and ``x-ms-continuation-queryId`` while more remain, to pass back as ``queryId``."""
        q = req.query
        rows_per_read = _int(q.get("rowsperread", "10"), "rowsPerRead")
        if rows_per_read < 1:
            raise ApiError(400, "rowsPerRead must be at least 1.")
        headers: dict[str, str] = {}
        if "startrow" in q:
            start = _int(q["startrow"], "startRow")
            page = rows[start : start + rows_per_read]
            headers["x-ms-row-count"] = str(len(rows))
        else:
            position = 0
            if q.get("queryid"):
                rows, position, stored = self.queries.take(q["queryid"])
                if "properties" not in q:
                    names = stored
            page = rows[position : position + rows_per_read]
            if position + rows_per_read < len(rows):
                headers["x-ms-continuation-queryId"] = self.queries.put(rows, position + rows_per_read, names)
        with self.cluster.lock:
            body = [_object(render(row, names)) for row in page]
        return Reply(200, body, headers)


# ------------------------------------------------------------------------------------------ values


def _job_values(job: Job, names: Sequence[str] | None) -> list[tuple[str, str]]:
    wanted = names if names is not None else [p.name for p in P.JOB_PROPS if not p.secret]
    return [(n, job_value(job, n)) for n in wanted]


def job_value(job: Job, name: str) -> str:
    if name == "HasRuntime":
        return str(job.props["RuntimeSeconds"] != "0")
    return job.props.get(name, "")


def _task_values(task: Task, names: Sequence[str] | None) -> list[tuple[str, str]]:
    wanted = names if names is not None else [p.name for p in P.TASK_PROPS]
    return [(n, task_value(task, n)) for n in wanted]


def task_value(task: Task, name: str) -> str:
    if name == "HasRuntime":
        return str(task.props["RuntimeSeconds"] != "0")
    return task.props.get(name, "")


def _props(pairs: Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"Name": n, "Value": v} for n, v in pairs]


def _object(pairs: Iterable[tuple[str, str]]) -> dict[str, list[dict[str, str]]]:
    return {"Properties": _props(pairs)}


def _names(text: str | None, table: Mapping[str, P.Prop], what: str) -> list[str] | None:
    """``properties=a,B`` -> canonical names; None (all) when absent or empty."""
    if text is None or not text.strip():
        return None
    names: list[str] = []
    for item in P.split_list(text):
        try:
            prop = P.lookup(table, item, what)
        except P.PropError as err:
            raise ApiError(400, str(err)) from None
        if prop.secret:
            raise ApiError(400, f"The {what} property {prop.name} cannot be read.")
        if prop.name not in names:
            names.append(prop.name)
    return names


def _plain_names(text: str | None, table: Sequence[str]) -> list[str]:
    if text is None or not text.strip():
        return list(table)
    by_key = {n.lower(): n for n in table}
    names: list[str] = []
    for item in P.split_list(text):
        if item.lower() not in by_key:
            raise ApiError(400, f"The node property '{item}' does not exist.")
        if by_key[item.lower()] not in names:
            names.append(by_key[item.lower()])
    return names


def _sorted(
    rows: list[Any],
    key_name: str | None,
    default: str,
    query: Mapping[str, str],
    known: Iterable[str],
    value: Callable[[Any, str], str],
) -> list[Any]:
    """Sort by a property (an unknown name sorts by the default key), numbers as numbers; ``asc`` (default
    true) gives the order."""
    ascending = query.get("asc", "true").lower()
    if ascending not in ("true", "false"):
        raise ApiError(400, "asc must be true or false.")
    name = {n.lower(): n for n in known}.get((key_name or "").lower(), default)
    if name == "TaskId":
        name = "JobTaskId"  # "3.10" after "3.9"

    def key(row: Any) -> tuple[int, int, str]:
        text = value(row, name)
        return (0, int(text), "") if re.fullmatch(r"-?\d+", text) else (1, 0, text.lower())

    return sorted(rows, key=key, reverse=ascending == "false")


def _filters(text: str | None, allowed: Sequence[str]) -> list[tuple[str, str]]:
    """``$filter=<name> eq <value>[ and ...]`` (spaces as ``%20`` or ``+``), names case-insensitive."""
    if text is None or not text.strip():
        return []
    found: list[tuple[str, str]] = []
    for clause in re.split(r"\s+and\s+", text.strip(), flags=re.IGNORECASE):
        match = re.fullmatch(r"\s*(\w+)\s+eq\s+(.*?)\s*", clause, flags=re.IGNORECASE)
        if match is None:
            raise ApiError(400, f"The filter '{clause}' is not of the form '<name> eq <value>'.")
        for name in allowed:
            if name.lower() == match.group(1).lower():
                found.append((name, match.group(2).strip("'\"")))
                break
        else:
            raise ApiError(400, f"The filter name {match.group(1)} is not one of: {', '.join(allowed)}.")
    return found


def _enum(text: str, choices: Sequence[str], what: str) -> str:
    for choice in choices:
        if choice.lower() == text.strip().lower():
            return choice
    raise ApiError(400, f"'{text}' is not a valid {what}; expected one of: {', '.join(choices)}.")


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ApiError(400, f"{what} must be an integer, not '{text}'.") from None


def _time(text: str) -> dt.datetime:
    try:
        return P.parse_time(text)
    except P.PropError as err:
        raise ApiError(400, str(err)) from None


def _forced(req: Request) -> bool:
    value = req.query.get("forced", "false").lower()
    if value not in ("true", "false"):
        raise ApiError(400, "forced must be true or false.")
    return value == "true"


# ------------------------------------------------------------------------------------------ bodies


def _json(req: Request) -> Any:
    """The request body as JSON, or NO_BODY when there is none. Bodies must be JSON (the spec consumes
    application/json only)."""
    if not req.body.strip():
        return NO_BODY
    media = req.content_type.split(";")[0].strip().lower()
    if media not in ("application/json", "text/json") and not media.endswith("+json"):
        raise ApiError(415, f"The request body must be application/json, not '{req.content_type or 'none'}'.")
    try:
        return json.loads(req.body.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ApiError(400, f"The request body is not valid JSON: {err}.") from None


def _json_string(req: Request, optional: bool = True) -> str | None:
    data = _json(req)
    if data is NO_BODY or data is None:
        if optional:
            return None
        raise ApiError(400, "The request needs a body: a JSON string.")
    if not isinstance(data, str):
        raise ApiError(400, "The request body must be a JSON string.")
    return data


def _json_object(req: Request) -> dict[str, Any]:
    """A JSON object body (a NodeGroup, a NodeGroupOperation)."""
    data = _json(req)
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    return data


def _properties(req: Request, *, optional: bool, nulls: bool = False) -> list[tuple[str, str | None]]:
    """A RestProperty array; keys ``Name``/``Value`` in any case, values strings (or null when ``nulls``)."""
    data = _json(req)
    if data is NO_BODY or data is None:
        if optional:
            return []
        raise ApiError(400, 'The request needs a body: an array of {"Name": ..., "Value": ...}.')
    if not isinstance(data, list):
        raise ApiError(400, 'The request body must be an array of {"Name": ..., "Value": ...}.')
    pairs: list[tuple[str, str | None]] = []
    for item in data:
        if not isinstance(item, dict):
            raise ApiError(
                400, f'Each property must be an object {{"Name": ..., "Value": ...}}, not {item!r}.'
            )
        low = {str(k).lower(): v for k, v in item.items()}
        name, value = low.get("name"), low.get("value")
        if not isinstance(name, str) or not name.strip():
            raise ApiError(400, f"A property has no Name: {item!r}.")
        if value is None and nulls:
            pairs.append((name.strip(), None))
        elif not isinstance(value, str):
            raise ApiError(400, f"The Value of property {name} must be a string, not {json.dumps(value)}.")
        else:
            pairs.append((name.strip(), value))
    return pairs


def parse_query(raw: str) -> dict[str, str]:
    return {k.lower(): v[-1] for k, v in parse_qs(raw, keep_blank_values=True).items()}
