"""A test bed of several "hosts" on one machine, for running the generated HPC Pack job for real.

Each host is a network namespace with its own host name, /etc/hosts and root (where the share
folder is mounted at /app); a private smbd serves the same folder as //HEADNODE/CcpSpoolDir/app.
Plain context managers (for benchmarks too) and, in `fixtures`, pytest fixtures:

    with TestBed(["node1", "node2"]) as bed:
        bed["NODE1"].check_output("getent hosts NODE2")

Needs root, iproute2, util-linux and samba (smbd, smbpasswd); see `missing_prerequisites`
and `require_testbed` (pytest: skip, or fail when CI=true).
"""

from .bed import TestBed
from .hosts import Host, HostCommandError, Hosts
from .prerequisites import missing_prerequisites, require_testbed
from .smb import SmbServer
from .system import PREFIX, sweep_leftovers

__all__ = [
    "PREFIX",
    "Host",
    "HostCommandError",
    "Hosts",
    "SmbServer",
    "TestBed",
    "missing_prerequisites",
    "require_testbed",
    "sweep_leftovers",
]
