"""Where secrets come from: the environment or a prompt, never the command line, never printed."""

from __future__ import annotations

import getpass
import os
import sys

from hpcjob.job.spec import SpecError

SMB_USER_ENV = "HPCJOB_SMB_USER"
SMB_PASSWORD_ENV = "HPCJOB_SMB_PASSWORD"
# `cluster onboard`: the new cluster's admin password and its nodes' authentication key (kept out of the
# tasks' environment: hpcjob.store.config).
ADMIN_PASSWORD_ENV = "HPCJOB_ADMIN_PASSWORD"
AUTH_KEY_ENV = "HPCJOB_AUTH_KEY"


def smb_user(option: str | None) -> str:
    user = option or os.environ.get(SMB_USER_ENV)
    if not user:
        raise SpecError(f"no SMB user: give --smb-user or set {SMB_USER_ENV}")
    return user


def smb_password(user: str) -> str:
    password = os.environ.get(SMB_PASSWORD_ENV)
    if password is not None:
        return password
    if sys.stdin.isatty():
        return getpass.getpass(f"SMB password for {user}: ")
    raise SpecError(f"no SMB password: set {SMB_PASSWORD_ENV} or run in a terminal to be asked")
