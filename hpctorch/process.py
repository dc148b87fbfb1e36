"""Who this process is, as torchrun and hpcjob's node helper say it: its rank, node and timeline file.
Python 3.6 and the standard library."""

import json
import os
import socket
import time
from typing import Any, Dict, Optional

TIMELINE_FOLDER = "metrics"  # under the run's log folder (HPCJOB_LOG_DIR), where hpcjob reads it


def env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def node_name() -> str:
    """This node's name as hpcjob knows it (HPCJOB_NODE), else the host's short name."""
    return (os.environ.get("HPCJOB_NODE") or socket.gethostname()).split(".")[0]


def timeline_path(folder: Optional[str] = None) -> Optional[str]:
    """This rank's timeline file in `folder` [default: the run's metrics folder under hpcjob; None
    without one], the folder made."""
    if folder is None:
        log_dir = os.environ.get("HPCJOB_LOG_DIR")
        if not log_dir:
            return None
        folder = os.path.join(log_dir, TIMELINE_FOLDER)
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, "{}-{}.jsonl".format(node_name(), env_int("LOCAL_RANK", 0)))


def timeline_line(event: str, fields: Dict[str, Any]) -> str:
    """One line of the timeline: the time, the event, who wrote it, and `fields`."""
    line: Dict[str, Any] = {
        "t": round(time.time(), 3),
        "event": event,
        "node": node_name(),
        "rank": env_int("RANK", 0),
        "world_size": env_int("WORLD_SIZE", 1),
        "restart": env_int("TORCHELASTIC_RESTART_COUNT", 0),
    }
    line.update(fields)
    return json.dumps(line) + "\n"
