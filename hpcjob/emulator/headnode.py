"""``HeadNode``: an HPC Pack 2019 head node on loopback, for tests and local trials.

Every "node" runs its tasks as local processes of this machine. A task's command reaches other tasks
through node names, so the node that hosts a rendezvous (the first node of a hpcjob job: the
``--rdzv_endpoint`` host) must have a name that resolves here. ``LOCALHOST`` does everywhere
(``/etc/hosts`` maps ``localhost`` and host-name lookup ignores case); the other default nodes need not
resolve, because nothing connects to them by name.
"""

from __future__ import annotations

import hmac
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Literal

from hpcjob.emulator.api import Api
from hpcjob.emulator.cluster import Cluster, check_losses
from hpcjob.emulator.jobs import NODE_LOST_MESSAGE
from hpcjob.emulator.nodes import UNKNOWN_GROUP_NODES, NodeSpec
from hpcjob.emulator.powershell import PowerShellHost
from hpcjob.emulator.props import ENDED
from hpcjob.emulator.server import Fault, Faults, RequestLog, _Server, make_server
from hpcjob.emulator.tls import make_certificate
from hpcjob.emulator.wsman import WsMan

PASSWORD_ENV = "HPCJOB_EMULATOR_PASSWORD"
DEFAULT_VERSION = "6.3.8328.0"  # made up, of the 2019 form; only its shape a.b.c.d is documented
GPU_GROUPS = ("ComputeNodes", "LinuxNodes", "GPUNodes")
DEFAULT_NODES = (
    NodeSpec("LOCALHOST", groups=GPU_GROUPS),  # resolves on any machine: it can host a rendezvous
    NodeSpec("NODE002", groups=GPU_GROUPS),
    NodeSpec("NODE003", groups=GPU_GROUPS),
    NodeSpec("NODE004", groups=("ComputeNodes", "LinuxNodes")),
)


def resolves(name: str) -> bool:
    """Whether a node name resolves on this machine (required of a job's rendezvous node)."""
    try:
        socket.getaddrinfo(name, None)
    except OSError:
        return False
    return True


class HeadNode:
    """An emulated HPC Pack head node with two front doors over HTTPS on the same cluster: the REST API
    (Basic auth) at ``head.url`` and WinRM (WS-Management; NTLM or Basic) at ``head.wsman_url``.

    ``with HeadNode(users={"alice": "pw"}) as head:`` then talk to ``head.url`` (``https://127.0.0.1:PORT/hpc``)
    verifying TLS with ``head.ca_file``. Leaving the block kills every task process and removes the
    emulator's temporary folder (certificate and task folders).
    """

    def __init__(
        self,
        nodes: Iterable[NodeSpec | Mapping[str, Any]] | None = None,
        *,
        users: Mapping[str, str],
        admins: Iterable[str] | None = None,
        grace_period: float = 5.0,
        host: str = "127.0.0.1",
        port: int = 0,
        wsman_port: int = 0,
        domain: str | None = "HPC",
        version: str = DEFAULT_VERSION,
        head_name: str = "HEADNODE",
        command_line_limit: int | None = 480,
        step_delay: float = 0.0,
        backfill: bool = False,
        error_format: Literal["text", "json"] = "text",
        env: Mapping[str, str] | None = None,
        detection_delay_s: float = 90.0,
        unreachable_health: str = "Error",
        node_lost_message: str = NODE_LOST_MESSAGE,
        job_retry_count: int = 0,
        auto_requeue_delay_s: float = 2.0,
        node_operation_delay_s: float = 0.5,
        unknown_group_node: Literal["skip", "error"] = "skip",
    ) -> None:
        """
        nodes: NodeSpec objects or typed Node dicts (``{"Name", "State", "Health", "Cores", "Groups"...}``);
            default DEFAULT_NODES. The order is the node Id order of the node lists.
        users: user name -> password for Basic auth (names match case-insensitively).
        admins: users that are HPC Pack administrators (may use ``x-ms-as-user``, change any job);
            default: all of ``users``.
        grace_period: seconds between SIGINT and SIGKILL when tasks are canceled (0: SIGKILL at once).
        domain: Owner is ``DOMAIN\\user`` like on a domain-joined head node; None for a bare user name.
        command_line_limit: refuse longer task command lines with 400 (480: the documented HPC Pack 2008
            SDK figure, UNVERIFIED for 2019); None for no limit.
        step_delay: minimum seconds a job spends in each of Submitted, Validating and Queued (to let
            clients see them); 0 moves on as fast as the scheduler thread runs.
        backfill: let a later job start while an earlier queued one waits (default: strict order).
        error_format: error bodies as text/plain messages, or JSON ``{"Code", "Message", "Values"}``.
        env: the environment every task starts from (default: this process's, without the password).
        detection_delay_s: how long after a node is lost (`lose_node`) the head node notices it: the
            heartbeats it misses, HeartbeatInterval x InactivityCount (30 s x 3 by the documented
            defaults).
        unreachable_health: the health (REST `Health`, PowerShell `HealthState`) of a node the head node
            found unreachable; PowerShell's NodeHealth says Unreachable. "Error" is UNVERIFIED.
        node_lost_message: the ErrorMessage of a task its lost node took (`{node}`: the node's name);
            UNVERIFIED wording.
        job_retry_count: the cluster's JobRetryCount as the emulator applies it: how many times a job
            that failed because a node was lost is requeued by itself (documented default 3; here 0,
            since whether it applies to tasks that are not rerunnable is UNVERIFIED).
        auto_requeue_delay_s: how long such a job stays Failed before it is Queued again (UNVERIFIED).
        node_operation_delay_s: how long after a node operation is accepted (REST bringOnline and
            takeOffline, 202; Set-HpcNodeState -Async) the node's state changes: the spec says only that
            it is done asynchronously (the figure is the emulator's).
        unknown_group_node: what putting a node the cluster does not know in a node group does, through
            either door (REST moveNodesOfGroup, PowerShell Add-HpcGroup): "skip" leaves it out and puts
            the others in without an error (Add-HpcGroup's page: -NodeName is a filter; PowerShell still
            fails when it names no node that exists), "error" refuses the whole request (REST 404). For
            REST neither is documented: UNVERIFIED.
        """
        specs = [n if isinstance(n, NodeSpec) else NodeSpec.from_json(n) for n in (nodes or DEFAULT_NODES)]
        if not users:
            raise ValueError("the head node needs at least one user")
        if error_format not in ("text", "json"):
            raise ValueError("error_format must be 'text' or 'json'")
        self._specs = specs
        self._users = dict(users)
        self._admins = set(admins) if admins is not None else set(users)
        self.grace_period = grace_period
        self.host = host
        self._port = port
        self._domain = domain
        self.version = version
        self.head_name = head_name
        self._command_line_limit = command_line_limit
        self._step_delay = step_delay
        self._backfill = backfill
        self._error_format = error_format
        self._losses: dict[str, Any] = {
            "detection_delay_s": detection_delay_s,
            "unreachable_health": unreachable_health,
            "node_lost_message": node_lost_message,
            "job_retry_count": job_retry_count,
            "auto_requeue_delay_s": auto_requeue_delay_s,
        }
        check_losses(**self._losses)
        if node_operation_delay_s < 0:
            raise ValueError("node_operation_delay_s must not be negative")
        self._node_operation_delay_s = node_operation_delay_s
        if unknown_group_node not in UNKNOWN_GROUP_NODES:
            raise ValueError(f"unknown_group_node must be one of {', '.join(UNKNOWN_GROUP_NODES)}")
        self._unknown_group_node = unknown_group_node
        base = dict(os.environ if env is None else env)
        base.pop(PASSWORD_ENV, None)  # never hand the emulator's password to a task
        base.pop("NTLM_USER_FILE", None)  # nor another emulator's users file
        self._env = base
        self.requests = RequestLog()
        self._faults = Faults()
        self._folder: str | None = None
        self._server: _Server | None = None
        self._wsman_server: _Server | None = None
        self._wsman_port = wsman_port
        self._threads: list[threading.Thread] = []
        self.wsman_requests = RequestLog()
        self.wsman_url = ""
        self._cluster: Cluster | None = None
        self.ca_file = ""
        self.url = ""

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self) -> HeadNode:
        if self._server is not None:
            return self
        self._folder = tempfile.mkdtemp(prefix="hpcjob-emulator-")
        try:
            cert, key = make_certificate(self._folder)
            self._cluster = Cluster(
                self._specs,
                work_root=self._folder,
                grace_period=self.grace_period,
                domain=self._domain,
                command_line_limit=self._command_line_limit,
                step_delay=self._step_delay,
                backfill=self._backfill,
                base_env=self._env,
                head_name=self.head_name,
                password_of=self._password_of,
                node_operation_delay_s=self._node_operation_delay_s,
                unknown_group_node=self._unknown_group_node,
                **self._losses,
            )
            api = Api(self._cluster, version=self.version, head_name=self.head_name)
            self.powershell = PowerShellHost(self._cluster, self._password_ok)
            self.wsman = WsMan(self.powershell)
            servers = []
            for app in (api, self.wsman):
                servers.append(
                    make_server(
                        self.host,
                        self._port if app is api else self._wsman_port,
                        cert_file=cert,
                        key_file=key,
                        app=app,
                        users=self._users,
                        admins=self._admins,
                        log=self.requests if app is api else self.wsman_requests,
                        faults=self._faults,
                        error_format=self._error_format,
                        domain=self._domain,
                    )
                )
            self._server, self._wsman_server = servers
            self._wsman_server.ntlm_users_file = self._ntlm_users_file(self._folder)
        except BaseException:
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        self._cluster.start()
        self.ca_file = cert
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"https://{host}:{self._server.server_address[1]}/hpc"
        self.wsman_url = f"https://{host}:{self._wsman_server.server_address[1]}/wsman"
        for name, server in (("http", self._server), ("wsman", self._wsman_server)):
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.1},
                name=f"hpcjob-emulator-{name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        return self

    def _password_of(self, owner: str) -> str:
        """The password of a job's owner (DOMAIN\\user), as the agent gives it to execution filters."""
        name = owner.rpartition("\\")[2].lower()
        return next((p for n, p in self._users.items() if n.lower() == name), "")

    def _password_ok(self, user: str, password: str) -> bool:
        """Whether `password` is the password of `user` (DOMAIN\\user, with the head node's domain, or
        user)."""
        domain, backslash, name = user.rpartition("\\")
        if backslash and domain.lower() != (self._domain or "").lower():
            return False
        known = {n.lower(): p for n, p in self._users.items()}
        return name.lower() in known and hmac.compare_digest(known[name.lower()].encode(), password.encode())

    def _ntlm_users_file(self, folder: str) -> str:
        """The users' passwords as pyspnego's NTLM acceptor reads them (DOMAIN:USER:PASSWORD), with and
        without the domain; in the emulator's own folder, readable by its owner only."""
        path = os.path.join(folder, "ntlm-users")
        lines = [
            f"{domain}:{user}:{password}"
            for user, password in self._users.items()
            for domain in {"", self._domain or ""}
        ]
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def close(self) -> None:
        """Stop serving, kill every task process, remove the temporary folder."""
        for server in (self._server, self._wsman_server):
            if server is not None:
                server.shutdown()
                server.server_close()
                server.close_connections()
        self._server = self._wsman_server = None
        if self._cluster is not None:
            self._cluster.close()
        if self._folder is not None:
            if os.environ.get("NTLM_USER_FILE", "").startswith(self._folder):
                del os.environ["NTLM_USER_FILE"]  # the file goes with the folder
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def __enter__(self) -> HeadNode:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/")[0]) if self.url else 0

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            raise RuntimeError("the head node is not started")
        return self._cluster

    # ---------------------------------------------------------------------------------------- nodes

    @property
    def nodes(self) -> list[NodeSpec]:
        """The nodes as they are now."""
        with self.cluster.lock:
            return [
                NodeSpec(n.name, n.state, n.health, n.cores, n.sockets, n.memory_mb, tuple(n.groups))
                for n in self.cluster.nodes.values()
            ]

    def set_node(
        self,
        name: str,
        *,
        state: str | None = None,
        health: str | None = None,
        groups: Iterable[str] | None = None,
        cores: int | None = None,
    ) -> None:
        """Change a node at run time. Jobs only start on Online nodes with health OK; health Error makes the
        node unreachable: its running tasks are killed and fail. Other changes leave running tasks alone."""
        self.cluster.set_node(
            name,
            state=state,
            health=health,
            groups=tuple(groups) if groups is not None else None,
            cores=cores,
        )

    def remove_node(self, name: str) -> None:
        """Remove a node from the cluster, as an administrator's Remove-HpcNode does: it is no longer
        listed, nor in any group, and a request naming it finds no such node. A node a job holds is
        refused (ApiError)."""
        self.cluster.remove_node(name)

    def lose_node(self, name: str, how: Literal["evicted", "unreachable"] = "evicted") -> None:
        """Lose a node, as a Spot eviction (a deallocated VM) or an agent the head node no longer hears.

        "evicted": the node's task processes are SIGKILLed before this returns. "unreachable": they run
        on. Nothing else changes until ``detection_delay_s`` later, when the head node notices: REST
        shows the node's Health as ``unreachable_health``, PowerShell's Get-HpcNode its NodeHealth as
        Unreachable (``-Health Unreachable`` lists it) and its HealthState as ``unreachable_health``;
        each task the node took ends Failed with ``node_lost_message`` (its processes killed first if
        they still run), and its job does what a failed task makes it do (FailOnTaskFailure), or goes
        back to the queue while ``job_retry_count`` allows. The node's State stays (Online) unless an
        admin changes it; no job starts there until ``restore_node``. Tasks sent to it before the head
        node noticed never start, and fail then. ValueError if it is already lost."""
        self.cluster.lose_node(name, how)

    def restore_node(self, name: str) -> None:
        """A lost node is back and its agent reports: health OK at once, State as it was. Before the
        head node noticed the loss, what the node took ends now (an unreachable node's tasks that still
        run carry on). ValueError if the node is not lost."""
        self.cluster.restore_node(name)

    # ------------------------------------------------------------------------------ fault injection

    def inject(
        self,
        *,
        method: str | None = None,
        path: str = "",
        status: int | None = None,
        body: str | None = None,
        delay_before: float = 0.0,
        delay_after: float = 0.0,
        drop: Literal["before", "after"] | None = None,
        times: int | None = 1,
        skip: int = 0,
    ) -> Fault:
        """Act on the next ``times`` requests (None: all, until ``clear_faults``) whose method matches
        (None: any) and whose path (e.g. ``/hpc/jobs/3/submit``) matches the regex ``path`` (re.search):

        - ``delay_before`` seconds of waiting before anything else;
        - ``status``: answer that status (with ``body`` or a default message) without processing;
        - ``drop="before"``: close the connection without processing or answering;
        - ``delay_after`` seconds of waiting after processing, before answering (a create that times out
          on the client but still creates the job);
        - ``drop="after"``: process, then close the connection without answering.

        The first ``skip`` matching requests pass untouched. Faults apply before authentication, in
        the order they were added, to either front door; the returned Fault counts its ``hits``.
        """
        if drop not in (None, "before", "after"):
            raise ValueError("drop must be None, 'before' or 'after'")
        return self._faults.add(
            Fault(
                method=method.upper() if method else None,
                path=re.compile(path),
                status=status,
                body=body,
                delay_before=delay_before,
                delay_after=delay_after,
                drop=drop,
                times=times,
                skip=skip,
            )
        )

    def clear_faults(self) -> None:
        self._faults.clear()

    # ------------------------------------------------------------------------------ test helpers

    def job_history(self, job_id: int) -> list[str]:
        """Every state the job went through, in order, from Configuring."""
        with self.cluster.lock:
            return list(self.cluster.job(job_id).history)

    def task_history(self, job_id: int, task_id: int) -> list[str]:
        with self.cluster.lock:
            return list(self.cluster.task(job_id, task_id).history)

    def job_state(self, job_id: int) -> str:
        with self.cluster.lock:
            return self.cluster.job(job_id).state

    def wait_job(self, job_id: int, timeout: float = 30.0, states: Iterable[str] = ENDED) -> str:
        """Wait until the job is in one of ``states`` (default: ended); return the state."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        with self.cluster.changed:
            while True:
                state = self.cluster.job(job_id).state
                if state in wanted:
                    return state
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"job {job_id} is still {state} after {timeout} s")
                self.cluster.changed.wait(min(remaining, 0.2))

    def live_processes(self) -> set[tuple[int, int]]:
        """(pid, start time) of every process a task of this head node started that is still alive."""
        return self.cluster.live_processes()
