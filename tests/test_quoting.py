"""Script arguments reach the script exactly: the CommandLine, read back from the job XML and run by
bash as HPC Pack's Linux agent runs it (`cmd.sh` = "#!/bin/bash" + CommandLine), gives back the argv."""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hpcjob.job.plan import make_plan
from hpcjob.job.render import JOB_NAMESPACE, job_xml
from hpcjob.job.spec import JobSpec
from hpcjob.store.staging import node_files

FAKE_PYTHON = '#!/bin/bash\nprintf \'%s\\0\' "$@" > "$ARGV_FILE"\n'
XML_TEXT = st.characters(
    exclude_categories=("Cs",),
    exclude_characters="".join(
        map(chr, [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0xFFFE, 0xFFFF])
    ),
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job folder with the real node files, and a `python3` on PATH that records its argv."""
    root = tmp_path_factory.mktemp("node")
    for relative, content in node_files():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(content)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    return root


def run_task(node: Path, args: list[str]) -> list[str]:
    spec = JobSpec(
        script="run_ddp.py",
        script_args=tuple(args),
        node_names=("GPUNODE001", "GPUNODE002"),
        command_limit=100_000,
    )
    xml = job_xml(make_plan(spec, spec.node_names, "quoting-1"))
    task = ET.fromstring(xml.encode()).find(f"{{{JOB_NAMESPACE}}}Tasks/{{{JOB_NAMESPACE}}}Task")
    assert task is not None
    command_line = task.get("CommandLine")
    assert command_line is not None
    (node / "cmd.sh").write_text(f"#!/bin/bash\n\n{command_line}", encoding="utf-8")
    argv_file = node / "argv"
    env = {
        "PATH": f"{node / 'bin'}:{os.environ['PATH']}",
        "ARGV_FILE": str(argv_file),
        "CCP_NODES": "1 gpunode001 8",
        "HPCJOB_IFNAME": "lo",
        "HPCJOB_ADDR": "127.0.0.1",
        "LANG": "C.UTF-8",
    }
    subprocess.run(["/bin/bash", "cmd.sh"], cwd=node, env=env, check=True, capture_output=True)
    argv = argv_file.read_bytes().decode("utf-8").split("\0")[:-1]
    assert argv[:2] == ["-m", "torch.distributed.run"]
    assert "--rdzv_conf=is_host=1" in argv  # the store host, decided on the node whatever the case
    assert "--local_addr=127.0.0.1" in argv
    worker = argv.index(".hpcjob/worker.py")
    assert argv[worker + 1] == "run_ddp.py"
    return argv[worker + 2 :]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(st.text(alphabet=XML_TEXT, max_size=24), max_size=6))
@example(args=["with space", "it's", 'say "hi"', "$HOME", "$(touch pwned)", "`id`", "a;b", "x\\y", "\\"])
@example(args=["line1\nline2", "tab\there", "cr\rlf", "naïve ünïcödé", "日本語", "emoji 🚀", ""])
@example(args=["*", "~", "-", "--flag=1", "&&", "|", ">out", "!", "#hash", "{a,b}", "%PATH%"])
@example(
    args=["\r", "\r\n", "x\r'@\rWrite-Host PWNED", "\u2018\u2019\u201a\u201b", "\x7f\x85\x9b", "\u2028\u2029"]
)
def test_bash_gives_back_the_script_arguments(node: Path, args: list[str]) -> None:
    assert run_task(node, args) == args
    assert not (node / "pwned").exists()
