"""What goes to the share, and that an unchanged folder is not sent again."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import hpctorch
from hpcjob.store.share import LocalFolder
from hpcjob.store.staging import IGNORE_FILE, code_files, is_ignored, parse_ignore, upload


def make_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_default_ignore_keeps_data_checkpoints_and_caches_home(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            "train.py": "x",
            "lib/model.py": "x",
            "data/big.bin": "x",
            "checkpoints/c.pt": "x",
            "w.pt": "x",
            "__pycache__/a.pyc": "x",
            "lib/__pycache__/b.pyc": "x",
            ".git/HEAD": "x",
            "logs/a.out": "x",
        },
    )
    assert sorted(str(f.relative) for f in code_files(tmp_path)) == ["lib/model.py", "train.py"]


def test_hpcjobignore_replaces_the_defaults(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            IGNORE_FILE: "# keep data, drop the notebooks\n*.ipynb\nsub/only/\n",
            "data/small.csv": "x",
            "n.ipynb": "x",
            "sub/only/x.py": "x",
            "only/y.py": "x",
            "train.py": "x",
        },
    )
    assert sorted(str(f.relative) for f in code_files(tmp_path)) == [
        "data/small.csv",
        "only/y.py",
        "train.py",
    ]


def test_patterns() -> None:
    patterns = parse_ignore("a/b\n*.log\ncache/\n")
    assert is_ignored(PurePosixPath("a/b"), False, patterns)
    assert not is_ignored(PurePosixPath("x/a/b"), False, patterns)  # a slash anchors the pattern
    assert is_ignored(PurePosixPath("deep/x.log"), False, patterns)
    assert is_ignored(PurePosixPath("deep/cache"), True, patterns)
    assert not is_ignored(PurePosixPath("deep/cache"), False, patterns)  # dir/ matches folders only


def test_sync_sends_only_what_changed(tmp_path: Path) -> None:
    code, share = tmp_path / "code", tmp_path / "share" / "hpcjob" / "job"
    make_tree(code, {"train.py": "print(1)\n", "lib/util.py": "x = 1\n"})
    folder = LocalFolder(tmp_path / "share")
    requirements = ((".hpcjob/requirements-abc.txt", "tiny==1.0\n"),)  # a plan's file
    first = upload(code, folder, "hpcjob/job", requirements)
    library = sorted(p.name for p in Path(hpctorch.__file__).parent.glob("*.py"))  # .hpcjob/lib/hpctorch
    # 2 code files, 4 node files and the library's, 1 of the plan
    assert first.files_sent == 7 + len(library) and first.files_unchanged == 0
    assert sorted(p.name for p in (share / ".hpcjob").iterdir()) == [
        "datasets.py", "env.py", "lib", "manifest.json", "node.sh", "requirements-abc.txt", "worker.py"
    ]  # fmt: skip
    assert sorted(p.name for p in (share / ".hpcjob" / "lib" / "hpctorch").iterdir()) == library
    assert (share / ".hpcjob" / "requirements-abc.txt").read_text() == "tiny==1.0\n"
    again = upload(code, folder, "hpcjob/job", requirements)
    assert (again.files_sent, again.bytes_sent, again.files_unchanged) == (0, 0, 2)
    (code / "train.py").write_text("print(22)\n")
    os.utime(code / "train.py", ns=(1, 1))
    changed = upload(code, folder, "hpcjob/job")
    assert (changed.files_sent, changed.bytes_sent) == (1, len("print(22)\n"))
    assert (share / "train.py").read_text() == "print(22)\n"
