"""What every part of the emulated head node shares: a refusal, who asks, and the clock.

`ApiError` is how the scheduler refuses a request (both front doors turn it into their answer), `Actor`
is who a request acts as, and `now` stamps the times the properties report. They sit below the nodes,
the jobs, the scheduler and the agent so that each of those can use them without importing another.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


class ApiError(Exception):
    """An answer other than success: HTTP status and the human message the body carries."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Actor:
    """Who a request acts as: the authenticated user, or the one named by ``x-ms-as-user``."""

    name: str
    admin: bool


def now() -> dt.datetime:
    return dt.datetime.now().replace(microsecond=0)
