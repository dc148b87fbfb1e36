"""An emulated Microsoft HPC Pack 2019 head node (REST API over HTTPS) for tests.

It follows the documented protocol (reference/hpcpack-rest-api/hpcpack.yaml, the 2016 spec for
``/nodes*``, facts/hpcpack-rest.md) and runs each task the way the Linux node agent does, as a local
process. See README.md in this folder.
"""

from hpcjob.emulator.cli import main
from hpcjob.emulator.headnode import DEFAULT_NODES, PASSWORD_ENV, HeadNode, resolves
from hpcjob.emulator.nodes import NodeSpec
from hpcjob.emulator.server import Fault, RequestLog, RequestRecord

__all__ = [
    "DEFAULT_NODES",
    "PASSWORD_ENV",
    "Fault",
    "HeadNode",
    "NodeSpec",
    "RequestLog",
    "RequestRecord",
    "main",
    "resolves",
]
