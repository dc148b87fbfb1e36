"""The data port between a trainer node and a data node, for `hpcjob doctor`: one job of one trainer
(under torchrun) and one data node (HPCJOB_ROLE=data), as a run with --data-nodes is. The data node
listens on HPCJOB_DATA_PORT at its address (HPCJOB_ADDR, the node helper's) and publishes it in
HPCJOB_DATA_DIR; the trainer reads it, connects, and has a word echoed back. The standard library
only: it tests the network and the job's shape, not the nodes' packages. The trainer prints one
`HPCJOB_METRICS {...}` line: whether it reached the port, where, and in how many seconds.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path


def main() -> int:
    folder = Path(os.environ["HPCJOB_DATA_DIR"])
    port = int(os.environ["HPCJOB_DATA_PORT"])
    wait_s = float(os.environ.get("HPCJOB_DATA_WAIT_S", "60"))
    where = folder / "doctor.json"
    if os.environ.get("HPCJOB_ROLE") == "data":
        address = os.environ.get("HPCJOB_ADDR") or socket.gethostbyname(socket.gethostname())
        with socket.create_server((address, port)) as server:
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / f".doctor.json.{os.getpid()}"
            partial.write_text(json.dumps({"address": address, "port": port}), encoding="utf-8")
            partial.replace(where)
            server.settimeout(wait_s)
            connection, _ = server.accept()
            with connection:
                connection.settimeout(wait_s)
                connection.sendall(b"echo " + connection.recv(64))
        return 0
    started = time.monotonic()
    while not where.is_file():
        if time.monotonic() - started > wait_s:
            print(f"error: the data node published no address in {wait_s:g} s", file=sys.stderr)
            return 1
        time.sleep(0.2)
    published = json.loads(where.read_text(encoding="utf-8"))
    word = secrets.token_hex(8).encode()
    began = time.monotonic()
    try:
        with socket.create_connection((published["address"], int(published["port"])), timeout=10) as sock:
            sock.sendall(word)
            answer = sock.recv(64)
    except OSError as exc:
        print(f"error: cannot reach {published['address']}:{published['port']}: {exc}", file=sys.stderr)
        return 1
    figures = {
        "data_port_reachable": answer == b"echo " + word,
        "data_port_at": f"{published['address']}:{published['port']}",
        "data_port_s": round(time.monotonic() - began, 3),
    }
    print("HPCJOB_METRICS " + json.dumps(figures), flush=True)
    return 0 if figures["data_port_reachable"] else 1


if __name__ == "__main__":
    sys.exit(main())
