"""Who may write a folder on the share, as the SMB server sees it: a folder's owner and DACL (its Windows
security descriptor), read and set through smbprotocol, and judged.

A cluster user's folder on the share (`hpcjob/<user>/`) holds their job folders, whose node files run in
every task of their jobs, and their wheels and environments: only they may write there. hpcjob makes it
with a protected DACL (nothing inherited from above) that gives full control to its owner, SYSTEM and
BUILTIN\\Administrators, inherited by everything in it, and checks at every upload that it still is so.
Whoever may delete or rename entries of the folder above (FILE_DELETE_CHILD there, or its owner, who may
grant that to themselves) could move the user's folder away and put one of their own in its place, so
that folder is checked too: it must be an administrator's (`hpcjob mount --install` prepares it), that
is the owner of the share's own folder, SYSTEM or BUILTIN\\Administrators. A domain's SIDs do not say
who is an administrator, hence the share's owner as the reference. Access mask bits: MS-DTYP 2.4.3 and
MS-SMB2 2.2.13.1.1; security descriptors over SMB2 QUERY_INFO / SET_INFO with InfoType
SMB2_0_INFO_SECURITY: MS-SMB2 2.2.37, 2.2.39.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FILE_LIST_DIRECTORY = 0x1
FILE_ADD_FILE = 0x2
FILE_ADD_SUBDIRECTORY = 0x4
FILE_READ_EA = 0x8
FILE_WRITE_EA = 0x10
FILE_TRAVERSE = 0x20
FILE_DELETE_CHILD = 0x40
FILE_READ_ATTRIBUTES = 0x80
FILE_WRITE_ATTRIBUTES = 0x100
DELETE = 0x10000
READ_CONTROL = 0x20000
WRITE_DAC = 0x40000
WRITE_OWNER = 0x80000
SYNCHRONIZE = 0x100000
ACCESS_SYSTEM_SECURITY = 0x1000000
MAXIMUM_ALLOWED = 0x2000000
GENERIC_ALL = 0x10000000
GENERIC_WRITE = 0x40000000
FULL_CONTROL = 0x1F01FF
# What lets a trustee change a folder or what is in it.
WRITE_RIGHTS = (
    FILE_ADD_FILE | FILE_ADD_SUBDIRECTORY | FILE_WRITE_EA | FILE_DELETE_CHILD | FILE_WRITE_ATTRIBUTES | DELETE
    | WRITE_DAC | WRITE_OWNER | ACCESS_SYSTEM_SECURITY | MAXIMUM_ALLOWED | GENERIC_ALL | GENERIC_WRITE
)  # fmt: skip
# What lets a trustee of the folder above remove or rename an entry of it, or grant themselves that.
MOVE_RIGHTS = FILE_DELETE_CHILD | DELETE | WRITE_DAC | WRITE_OWNER | GENERIC_ALL
# Every cluster user may make their own folder in hpcjob/ and see it; nothing more.
MAKE_FOLDERS = (
    FILE_LIST_DIRECTORY | FILE_ADD_SUBDIRECTORY | FILE_READ_EA | FILE_TRAVERSE | FILE_READ_ATTRIBUTES
    | READ_CONTROL | SYNCHRONIZE
)  # fmt: skip

SYSTEM = "S-1-5-18"
ADMINISTRATORS = "S-1-5-32-544"
AUTHENTICATED_USERS = "S-1-5-11"
CREATOR_OWNER = "S-1-3-0"  # an inherit-only entry: its rights go to whoever makes an entry below
UNIX_ROOT = "S-1-22-1-0"  # Samba's name for uid 0 where it has no account for it
TRUSTED = (SYSTEM, ADMINISTRATORS, UNIX_ROOT)

OBJECT_INHERIT, CONTAINER_INHERIT, INHERIT_ONLY = 0x1, 0x2, 0x8
OWNER_INFORMATION, DACL_INFORMATION = 0x1, 0x4


@dataclass(frozen=True)
class Ace:
    allow: bool | None  # None: an entry of another kind (object, callback), judged as the worst
    sid: str
    mask: int
    flags: int


@dataclass(frozen=True)
class Security:
    owner: str | None
    dacl: tuple[Ace, ...] | None  # None: no DACL at all, which lets everyone do everything
    protected: bool


def others_who_may_write(security: Security, me: str) -> list[str]:
    """Why someone other than `me` (and SYSTEM, the Administrators) may change this folder or what is in
    it; [] when it is `me`'s alone."""
    found = [] if security.owner == me else [f"its owner is {security.owner}, not you ({me})"]
    if security.dacl is None:
        return [*found, "it has no DACL: everyone may write in it"]
    if not security.protected:
        found.append("its DACL takes entries from the folder above")
    for ace in security.dacl:
        if ace.allow is None:
            found.append(f"an entry hpcjob cannot read gives {ace.sid} rights")
        elif ace.allow and ace.sid != me and ace.sid not in TRUSTED and ace.mask & WRITE_RIGHTS:
            found.append(f"{ace.sid} may write in it")
    return found


def others_who_may_move(security: Security, me: str, share_owner: str | None) -> list[str]:
    """Why someone other than `me`, SYSTEM, the Administrators and `share_owner` (whoever owns the share's
    folder itself, an administrator: the folder above could be theirs anyway) may remove or rename the
    entries of this folder: its owner (who may grant that to themselves), or an entry that grants it."""
    trusted = (me, *TRUSTED, *((share_owner,) if share_owner else ()))
    found = [] if security.owner in trusted else [f"it is {security.owner}'s"]
    if security.dacl is None:
        return [*found, "it has no DACL"]
    for ace in security.dacl:
        if ace.sid == CREATOR_OWNER and ace.flags & INHERIT_ONLY:
            continue  # gives each maker rights on what they make, nothing on the folder itself
        if ace.allow is None:
            found.append(f"an entry hpcjob cannot read gives {ace.sid} rights")
        elif ace.allow and ace.sid not in trusted and ace.mask & MOVE_RIGHTS:
            found.append(f"{ace.sid} may remove or rename what is in it")
    return found


def read_security(handle: Any) -> Security:
    """The owner and DACL of an open smbprotocol Open (READ_CONTROL)."""
    from smbprotocol.security_descriptor import AccessAllowedAce, AccessDeniedAce, SDControl

    descriptor = _query(handle, OWNER_INFORMATION | DACL_INFORMATION)
    control = descriptor["control"].get_value()
    owner = descriptor.get_owner()
    dacl = None
    if control & SDControl.DACL_PRESENT:
        aces = []
        for ace in descriptor.get_dacl()["aces"].get_value():
            if isinstance(ace, (AccessAllowedAce, AccessDeniedAce)):
                allow = isinstance(ace, AccessAllowedAce)
                sid, mask, flags = (
                    str(ace["sid"].get_value()),
                    ace["mask"].get_value(),
                    ace["ace_flags"].get_value(),
                )
                aces.append(Ace(allow, sid, mask, flags))
            else:  # raw bytes: a kind smbprotocol does not parse
                aces.append(Ace(None, "an unknown trustee", 0, 0))
        dacl = tuple(aces)
    return Security(str(owner) if owner is not None else None, dacl, bool(control & SDControl.DACL_PROTECTED))


def set_dacl(handle: Any, entries: tuple[tuple[str, int, int], ...]) -> None:
    """Give an open smbprotocol Open (WRITE_DAC) a protected DACL of (sid, mask, flags) allow entries."""
    from smbprotocol.security_descriptor import (
        AccessAllowedAce,
        AclPacket,
        SDControl,
        SIDPacket,
        SMB2CreateSDBuffer,
    )

    aces = []
    for sid, mask, flags in entries:
        ace = AccessAllowedAce()
        ace["ace_flags"] = flags
        ace["mask"] = mask
        trustee = SIDPacket()
        trustee.from_string(sid)
        ace["sid"] = trustee
        aces.append(ace)
    acl = AclPacket()
    acl["aces"] = aces
    descriptor = SMB2CreateSDBuffer()
    descriptor["control"].set_flag(SDControl.SELF_RELATIVE)  # smbprotocol does not set it itself
    descriptor["control"].set_flag(SDControl.DACL_PROTECTED)
    descriptor.set_dacl(acl)
    _send(handle, _set_request(handle, descriptor, DACL_INFORMATION))


def set_owner(handle: Any, sid: str) -> None:
    """Make `sid` the owner of an open smbprotocol Open (WRITE_OWNER; the server decides who may)."""
    from smbprotocol.security_descriptor import SDControl, SIDPacket, SMB2CreateSDBuffer

    owner = SIDPacket()
    owner.from_string(sid)
    descriptor = SMB2CreateSDBuffer()
    descriptor["control"].set_flag(SDControl.SELF_RELATIVE)
    descriptor.set_owner(owner)
    _send(handle, _set_request(handle, descriptor, OWNER_INFORMATION))


def owner_only(me: str) -> tuple[tuple[str, int, int], ...]:
    """The DACL of a user's folder: theirs, SYSTEM's and the Administrators', inherited by all below."""
    inherit = OBJECT_INHERIT | CONTAINER_INHERIT
    return tuple((sid, FULL_CONTROL, inherit) for sid in (me, SYSTEM, ADMINISTRATORS))


def owner_only_file(me: str) -> tuple[tuple[str, int, int], ...]:
    """The DACL of a file of secrets: its owner's alone. Not SYSTEM's nor the Administrators': nothing of
    the cluster reads it but the job's own tasks, which reach the share as its owner."""
    return ((me, FULL_CONTROL, 0),)


# What lets a trustee read a file's data, or take the right to.
READ_RIGHTS = 0x1 | GENERIC_ALL | MAXIMUM_ALLOWED | WRITE_DAC | WRITE_OWNER | 0x80000000  # GENERIC_READ


def others_who_may_read(security: Security, me: str) -> list[str]:
    """Why someone other than `me` may read this file (or give themselves the right to); [] when none
    may. The Administrators may take any file's ownership: not counted."""
    found = [] if security.owner == me else [f"its owner is {security.owner}, not you ({me})"]
    if security.dacl is None:
        return [*found, "it has no DACL: everyone may read it"]
    for ace in security.dacl:
        if ace.allow is None:
            found.append(f"an entry hpcjob cannot read gives {ace.sid} rights")
        elif ace.allow and ace.sid != me and ace.mask & READ_RIGHTS:
            found.append(f"{ace.sid} may read it")
    return found


def common_folder() -> tuple[tuple[str, int, int], ...]:
    """The DACL of hpcjob/ itself, set by an administrator: every cluster user may make their own folder
    there (and has full control of what they make), and nobody but SYSTEM and the Administrators may
    remove or rename it (not even the administrator's own account, which users cannot tell from theirs)."""
    inherit = OBJECT_INHERIT | CONTAINER_INHERIT
    return (
        *((sid, FULL_CONTROL, inherit) for sid in (SYSTEM, ADMINISTRATORS)),
        (AUTHENTICATED_USERS, MAKE_FOLDERS, 0),
        (CREATOR_OWNER, FULL_CONTROL, inherit | INHERIT_ONLY),
    )


def _query(handle: Any, information: int) -> Any:
    from smbprotocol.file_info import InfoType
    from smbprotocol.open import SMB2QueryInfoRequest, SMB2QueryInfoResponse
    from smbprotocol.security_descriptor import SMB2CreateSDBuffer

    request = SMB2QueryInfoRequest()
    request["info_type"] = InfoType.SMB2_0_INFO_SECURITY
    request["output_buffer_length"] = 65536
    request["additional_information"] = information
    request["file_id"] = handle.file_id
    response = SMB2QueryInfoResponse()
    response.unpack(_send(handle, request)["data"].get_value())
    descriptor = SMB2CreateSDBuffer()
    descriptor.unpack(response["buffer"].get_value())
    return descriptor


def _set_request(handle: Any, descriptor: Any, information: int) -> Any:
    from smbprotocol.file_info import InfoType
    from smbprotocol.open import SMB2SetInfoRequest

    request = SMB2SetInfoRequest()
    request["info_type"] = InfoType.SMB2_0_INFO_SECURITY
    request["additional_information"] = information
    request["file_id"] = handle.file_id
    request["buffer"] = descriptor
    return request


def _send(handle: Any, request: Any) -> Any:
    """One request on the handle's session and tree (smbprotocol 1.17's Open has no query or set of a
    security descriptor of its own); raises the server's refusal as smbprotocol's exception."""
    tree = handle.tree_connect
    sent = handle.connection.send(request, tree.session.session_id, tree.tree_connect_id)
    return handle.connection.receive(sent)
