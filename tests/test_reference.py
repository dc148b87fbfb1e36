"""The reference copies in tests/reference are the team's reference, byte for byte, when it is there."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import REFERENCE, SHARED_REFERENCE

# Copies fetched from their public source by this project and not (yet) in the team's reference: each is
# compared when the team's copy appears, and otherwise stands on the source and commit in the README.
OURS_ALONE = {"arm/GeneratedTemplates/add-lnx-compute-nodes.json"}


def copies() -> list[Path]:
    return sorted(
        p.relative_to(REFERENCE) for p in REFERENCE.rglob("*") if p.is_file() and p.name != "README.md"
    )


def test_the_copies_are_there() -> None:
    names = {str(p) for p in copies()}
    assert {
        "hpcpack-rest-api/hpcpack.yaml",
        "hpcpack-rest-api/2016/hpcpack.yaml",
        "job-xml-import-map.json",
    } <= names


@pytest.mark.skipif(not SHARED_REFERENCE.is_dir(), reason=f"no team reference at {SHARED_REFERENCE}")
@pytest.mark.parametrize("relative", copies(), ids=str)
def test_each_copy_is_the_shared_one(relative: Path) -> None:
    if str(relative) in OURS_ALONE and not (SHARED_REFERENCE / relative).exists():
        pytest.skip(f"{relative} is not in the team's reference")
    assert (REFERENCE / relative).read_bytes() == (SHARED_REFERENCE / relative).read_bytes()
