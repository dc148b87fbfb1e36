"""HTTPS transport of the emulated head node's front doors: TLS, authentication (Basic; NTLM through
pyspnego's acceptor where the front door takes it, as WinRM does), the request log and fault injection.

One server serves one front door (an `App`: the REST API below /hpc, or WS-Management at /wsman); both
act on the same Cluster."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import json
import os
import re
import socket
import ssl
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, NamedTuple, Protocol
from urllib.parse import urlsplit

from hpcjob.emulator.api import NO_BODY, Reply, Request, parse_query
from hpcjob.emulator.base import Actor, ApiError

MAX_BODY = 64 * 1024 * 1024


class App(Protocol):
    """A front door: the requests below its base path, from users authenticated by one of its schemes."""

    base_path: str
    auth_schemes: tuple[str, ...]  # "Basic", "Negotiate" (NTLM through SPNEGO's name), "NTLM"

    def handle(self, request: Request) -> Reply: ...


class RequestRecord(NamedTuple):
    method: str
    path: str  # the full path, e.g. /hpc/jobs/3
    query: str  # the raw query string


class RequestLog:
    """Every request the head node received, in order; safe to read while requests arrive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []

    def add(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self.snapshot())

    def __getitem__(self, index: int) -> RequestRecord:
        with self._lock:
            return self._records[index]

    def snapshot(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    def clear(self) -> None:
        with self._lock:
            self._records.clear()

    def count(self, method: str | None = None, path: str | None = None) -> int:
        """How many requests match ``method`` (any case) and the ``path`` regex (``re.search``)."""
        pattern = re.compile(path) if path is not None else None
        return sum(
            1
            for r in self.snapshot()
            if (method is None or r.method == method.upper()) and (pattern is None or pattern.search(r.path))
        )


@dataclass
class Fault:
    """What to do to the next ``times`` requests that match (None: every one, until cleared)."""

    method: str | None
    path: re.Pattern[str]
    status: int | None = None
    body: str | None = None
    delay_before: float = 0.0
    delay_after: float = 0.0
    drop: Literal["before", "after"] | None = None
    times: int | None = 1
    skip: int = 0  # matching requests let through before the fault acts
    hits: int = 0
    passed: int = 0

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and self.path.search(path) is not None

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.hits >= self.times


class Faults:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def take(self, method: str, path: str) -> Fault | None:
        """The first active fault that matches, counted as used."""
        with self._lock:
            for fault in self._faults:
                if not fault.exhausted and fault.matches(method, path):
                    if fault.passed < fault.skip:
                        fault.passed += 1
                        continue
                    fault.hits += 1
                    return fault
        return None

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(
        self,
        address: tuple[str, int],
        *,
        context: ssl.SSLContext,
        app: App,
        users: Mapping[str, str],
        admins: set[str],
        log: RequestLog,
        faults: Faults,
        error_format: str,
        domain: str | None = None,
    ) -> None:
        super().__init__(address, _Handler)
        self.domain = domain
        self.context = context
        self.app = app
        self.ntlm_users_file: str | None = None  # set where the app takes NTLM
        self.users = {name.lower(): (name, password) for name, password in users.items()}
        self.admins = {name.lower() for name in admins}
        self.log = log
        self.faults = faults
        self.error_format = error_format
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake happens here, in the connection's own thread, not in the accept loop.
        raw: socket.socket = request
        with self._connections_lock:
            self._connections.add(raw)
        try:
            raw.settimeout(30)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                tls = self.context.wrap_socket(raw, server_side=True)
            except (OSError, ssl.SSLError):
                return
            super().finish_request(tls, client_address)
        finally:
            with self._connections_lock:
                self._connections.discard(raw)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = 120  # idle keep-alive connections
    server_version = "Microsoft-HTTPAPI/2.0"
    sys_version = ""

    _ntlm: Any = None  # this connection's NTLM acceptor (an HTTP handler serves one connection)
    _ntlm_actor: Actor | None = None  # who authenticated this connection with NTLM

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: nothing about requests (or their credentials) is logged."""

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def _serve(self, method: str) -> None:
        parts = urlsplit(self.path)
        self.server.log.add(RequestRecord(method, parts.path, parts.query))
        try:
            body = self._read_body()
        except ApiError as err:
            self.close_connection = True
            self._send(self._error(err.status, err.message))
            return
        fault = self.server.faults.take(method, parts.path)
        if fault is not None:
            if fault.delay_before:
                time.sleep(fault.delay_before)
            if fault.drop == "before":
                self._drop()
                return
            if fault.status is not None:
                self._send(self._error(fault.status, fault.body or f"Injected fault: HTTP {fault.status}."))
                return
        reply = self._process(method, parts.path, parts.query, body)
        if fault is not None:
            if fault.delay_after:
                time.sleep(fault.delay_after)
            if fault.drop == "after":
                self._drop()
                return
        self._send(reply)

    def _process(self, method: str, path: str, query: str, body: bytes) -> Reply:
        app = self.server.app
        try:
            actor = self._authenticate()
            if isinstance(actor, Reply):
                return actor  # a step of the NTLM handshake
            if actor is None:
                reply = self._error(401, "Authorization has been denied for this request.")
                reply.headers["WWW-Authenticate"] = ", ".join(
                    'Basic realm="HPC Pack"' if scheme == "Basic" else scheme for scheme in app.auth_schemes
                )
                return reply
            base = app.base_path
            if path.lower() != base and not path.lower().startswith(base + "/"):
                raise ApiError(404, f"No HTTP resource was found that matches the request URI '{path}'.")
            request = Request(
                method=method,
                path=path[len(base) :] or "/",
                query=parse_query(query),
                body=body,
                content_type=self.headers.get("Content-Type", ""),
                actor=actor,
            )
            reply = app.handle(request)
            if reply.status >= 400 and isinstance(reply.body, str) and reply.content_type is None:
                return self._error(reply.status, reply.body, reply.headers)
            return reply
        except ApiError as err:
            return self._error(err.status, err.message)
        except Exception as err:  # a bug of the emulator: answer 500 and say so on stderr
            traceback.print_exc(file=sys.stderr)
            return self._error(500, f"Internal error of the emulator: {type(err).__name__}: {err}")

    def _authenticate(self) -> Actor | Reply | None:
        header = self.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        schemes = {name.lower(): name for name in self.server.app.auth_schemes}
        if not header and self._ntlm_actor is not None:
            return self._ntlm_actor  # NTLM authenticates the connection, not each request
        if scheme.lower() in ("negotiate", "ntlm") and scheme.lower() in schemes:
            self._ntlm_actor = None
            return self._ntlm_step(schemes[scheme.lower()], encoded.strip())
        if scheme.lower() != "basic" or "basic" not in schemes:
            return None
        try:
            user, sep, password = (
                base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return None
        domain, backslash, name = user.rpartition("\\")
        if backslash and domain.lower() != (self.server.domain or "").lower():
            return None  # DOMAIN\\user is the head node's domain, or nobody
        known = self.server.users.get(name.lower())
        if not sep or known is None or not hmac.compare_digest(known[1].encode(), password.encode()):
            return None
        return self._actor(known[0])

    def _actor(self, name: str) -> Actor:
        admin = name.lower() in self.server.admins
        as_user = self.headers.get("x-ms-as-user")
        if as_user:
            if not admin:
                raise ApiError(403, "Only an HPC Pack administrator can act as another user (x-ms-as-user).")
            return Actor(name=as_user, admin=as_user.lower() in self.server.admins)
        return Actor(name=name, admin=admin)

    def _ntlm_step(self, scheme: str, token: str) -> Actor | Reply | None:
        """One leg of NTLM on this connection (negotiate, then authenticate): the challenge to send, the
        user once the client proved its password, or None when it did not."""
        import spnego
        import spnego.exceptions

        try:
            # pyspnego reads the users' file that NTLM_USER_FILE names, when the acceptor is made and
            # again at its last step: set for this server for both (one emulator's users at a time).
            with _NTLM_LOCK:
                os.environ["NTLM_USER_FILE"] = self.server.ntlm_users_file or ""
                if self._ntlm is None or token_is_negotiate(token):
                    self._ntlm = spnego.server(protocol="ntlm")
                answer = self._ntlm.step(base64.b64decode(token))
        except (spnego.exceptions.SpnegoError, binascii.Error, ValueError):
            self._ntlm = None
            return None
        if not self._ntlm.complete:
            reply = Reply(401, "", text=True)
            reply.headers["WWW-Authenticate"] = f"{scheme} {base64.b64encode(answer or b'').decode()}"
            return reply
        user = str(self._ntlm.client_principal or "").rpartition("\\")[2]
        known = self.server.users.get(user.lower())
        self._ntlm_actor = self._actor(known[0]) if known else None
        return self._ntlm_actor

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            total = 0
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                total += size
                if total > MAX_BODY:
                    raise ApiError(413, "The request body is too large.")
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = self.headers.get("Content-Length")
        if not length:
            return b""
        if not length.isdigit() or int(length) > MAX_BODY:
            raise ApiError(413 if length.isdigit() else 400, "The body is too large or its length is bad.")
        return self.rfile.read(int(length))

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
        """An error answer: the message as text/plain, or as a JSON fault when so configured."""
        if self.server.error_format == "json":
            return Reply(status, {"Code": status, "Message": message, "Values": None}, dict(headers or {}))
        return Reply(status, message, dict(headers or {}), text=True)

    def _send(self, reply: Reply) -> None:
        headers = dict(reply.headers)
        if reply.body is NO_BODY or reply.status in (202, 204):
            data = b""
            content_type = None
        elif reply.text:
            data = str(reply.body).encode("utf-8")
            content_type = reply.content_type or "text/plain; charset=utf-8"
        else:
            data = json.dumps(reply.body, ensure_ascii=False).encode("utf-8")
            content_type = "application/json; charset=utf-8"
        lines = [
            f"{self.protocol_version} {reply.status} {self.responses.get(reply.status, ('',))[0]}",
            f"Server: {self.server_version}",
            f"Date: {self.date_time_string()}",
            f"Content-Length: {len(data)}",
        ]
        if content_type is not None:
            lines.append(f"Content-Type: {content_type}")
        lines += [f"{name}: {value}" for name, value in headers.items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            self.wfile.write(head + data)  # one write: separate small writes cost a delayed ACK each
        except OSError:
            self.close_connection = True

    def _drop(self) -> None:
        """Close the connection without an answer (TCP shutdown, no TLS close_notify)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


def make_server(
    host: str,
    port: int,
    *,
    cert_file: str,
    key_file: str,
    app: App,
    users: Mapping[str, str],
    admins: set[str],
    log: RequestLog,
    faults: Faults,
    error_format: str,
    domain: str | None = None,
) -> _Server:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return _Server(
        (host, port),
        context=context,
        app=app,
        users=users,
        admins=admins,
        log=log,
        faults=faults,
        error_format=error_format,
        domain=domain,
    )


def token_is_negotiate(token: str) -> bool:
    """Whether an NTLM token is the first message (NEGOTIATE, type 1): a new handshake."""
    try:
        raw = base64.b64decode(token)
    except (binascii.Error, ValueError):
        return False
    return raw.startswith(b"NTLMSSP\x00\x01\x00\x00\x00")


_NTLM_LOCK = threading.Lock()  # NTLM_USER_FILE is one variable for the whole process
