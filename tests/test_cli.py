"""The command line: render prints without contacting anything; bad input is one line and exit 2."""

from __future__ import annotations

import getpass
import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import hpctorch
from hpcjob.job.render import JOB_NAMESPACE

from .conftest import REPO


def hpcjob(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "code" / "train.py"
    path.parent.mkdir()
    path.write_text("print('hi')\n")
    return path


def test_render_xml_is_the_default_and_carries_the_options(script: Path) -> None:
    options = shlex.split(
        "-n 2 --node gpu2 --node GPU1 --node-group GPUNodes --name exp1 --nproc-per-node 2 --rdzv-port 29555 "
        "--env A=1 --env 'B=x y' --max-restarts 1 --mount-point /mnt/app --run-id exp1-1"
    )
    result = hpcjob("render", *options, str(script), "--lr", "0.1", "--name", "not-an-option-of-hpcjob")
    assert result.returncode == 0, result.stderr
    root = ET.fromstring(result.stdout.encode())
    ns = {"j": JOB_NAMESPACE}
    assert root.get("Name") == "exp1-1"  # the run id: unique
    assert (root.get("RequestedNodes"), root.get("NodeGroups")) == ("gpu2,GPU1", "GPUNodes")
    tasks = root.findall("j:Tasks/j:Task", ns)
    line = tasks[0].get("CommandLine") or ""
    assert (
        "--rdzv_endpoint=gpu2:29555" in line and "--max_restarts=1" in line and "--nproc_per_node=2" in line
    )
    assert line.endswith("train.py --lr 0.1 --name not-an-option-of-hpcjob")
    assert tasks[1].get("WorkDirectory") == f"/mnt/app/hpcjob/{getpass.getuser()}/exp1"  # the owner's folder
    values = [v.findtext("j:Value", namespaces=ns) for v in root.iter(f"{{{JOB_NAMESPACE}}}Variable")]
    assert values[-2:] == ["1", "x y"]  # the job's --env, after the flight recorder's


def test_render_clusrun_and_json(script: Path) -> None:
    common = ["--node", "A", "--share", r"\\HEAD\CcpSpoolDir\app", "--run-id", "r1", str(script)]
    clusrun = hpcjob("render", "--format", "clusrun", *common)
    assert clusrun.returncode == 0, clusrun.stderr
    assert clusrun.stdout.startswith(
        'clusrun /user:system /nodes:A "m=/app; mkdir -p $m && { mountpoint -q $m ||'
    )
    assert "//HEAD/CcpSpoolDir/app" in clusrun.stdout
    plan = hpcjob("render", "--format", "json", *common)
    assert '"run_id": "r1"' in plan.stdout and '"world_size": 1' in plan.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--node", "A", "--gpus-per-node", "2", "--nproc-per-node", "4"], "more than the 2 GPUs per node"),
        (["-n", "3", "--node", "A", "--node", "B"], "fewer than the 3 asked for"),
        (["--node", "A", "--node", "a"], "is named twice"),
        (["--node", "bad_name"], "not a valid node name"),
        (["--node", "A", "--env", "NOVALUE"], "--env 'NOVALUE' must be NAME=VALUE"),
        (["--node", "A", "--command-limit", "100"], "more than the scheduler's limit of 100"),
        (["-n", "2"], "render needs the nodes"),
        (["--node", "A", "--nodes", "x"], "'x' is not a valid integer"),
        (["--node", "A", "--format", "yaml"], "'yaml' is not one of"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(script: Path, args: list[str], message: str) -> None:
    if "--format" in args:
        result = hpcjob("render", *args, str(script))
    else:
        result = hpcjob("render", *args, str(script))
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("hpcjob: error: ") and message in result.stderr


def test_missing_script_is_refused_and_nothing_is_started(tmp_path: Path) -> None:
    share = tmp_path / "share"
    result = hpcjob("run", "--local", "-n", "2", "--mount-point", str(share), str(tmp_path / "nope.py"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"hpcjob: error: script {tmp_path / 'nope.py'} does not exist"
    assert not share.exists()


def test_run_local_bad_input_starts_nothing(script: Path, tmp_path: Path) -> None:
    share = tmp_path / "share"
    result = hpcjob(
        "run",
        "--local",
        "-n",
        "2",
        "--gpus-per-node",
        "1",
        "--nproc-per-node",
        "2",
        "--mount-point",
        str(share),
        str(script),
    )
    assert result.returncode == 2 and "GPUs per node" in result.stderr
    assert not share.exists()


def test_run_without_a_cluster_says_how_to_add_one_or_run_here(script: Path) -> None:
    """Without --local, run is `submit --wait` on the default cluster (tests/test_rest_e2e.py)."""
    result = hpcjob("run", "-n", "1", str(script))
    assert result.returncode == 2 and result.stderr == (
        "hpcjob: error: run without --local runs on your default cluster, and none is configured: add one "
        "with `hpcjob cluster add NAME --url https://HEADNODE ...`, or run here with --local\n"
    )


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("--nodse", "--nodes"), ("--gpus-per-nod", "--gpus-per-node"), ("--lcoal", "--local"), ("-m", "-n"),
     ("--hang-timout=5m", "--hang-timeout"), ("--zzzzzzzz", None)],
)  # fmt: skip
def test_an_unknown_option_before_the_script_is_named_with_the_nearest(
    script: Path, typo: str, meant: str | None, tmp_path: Path
) -> None:
    """Before the script's name every word is hpcjob's: `--nodse 2 train.py` used to be "script --nodse
    does not exist". After it, everything is the script's."""
    share = tmp_path / "share"
    result = hpcjob("run", "--local", "--mount-point", str(share), typo, "2", str(script))
    name = typo.split("=")[0]
    hint = f" (did you mean {meant}?)" if meant else ""
    assert result.returncode == 2 and not share.exists()
    assert result.stderr == f"hpcjob: error: no such option {name}{hint}: see hpcjob run --help\n"


def test_status_logs_and_cancel_without_a_run_take_this_machines_newest(tmp_path: Path) -> None:
    from .conftest import empty_script, run_local, stand_in_python

    python = stand_in_python(tmp_path, "echo said $HPCJOB_NODE")
    where = ["--python", str(python), "--mount-point", str(tmp_path / "share")]
    for run_id in ("older-1", "newer-1"):
        done = run_local("--quiet", "--run-id", run_id, *where, str(empty_script(tmp_path)))
        assert done.returncode == 0, done.stderr
    for command, said in (
        ("status", "Finished"),
        ("logs", "[LOCAL1] said LOCAL1"),
        ("cancel", "had already"),
    ):
        result = hpcjob(command)
        assert result.returncode == 0, result.stderr
        assert result.stderr == "hpcjob: run newer-1, the newest of this machine\n" and said in result.stdout


def test_help_lists_the_commands() -> None:
    result = hpcjob("--help")
    assert result.returncode == 0
    assert "render" in result.stdout and "run" in result.stdout
    assert "Options go before SCRIPT" in result.stdout


def test_help_imports_neither_torch_nor_requests_nor_winrm() -> None:
    code = (
        "import sys; from hpcjob.cli import cli\n"
        "try:\n    cli.main(['--help'], standalone_mode=False)\nexcept SystemExit: pass\n"
        "heavy = {'torch', 'requests', 'winrm', 'jinja2'} & set(sys.modules)\n"
        "print(sorted(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["render", "-n", "2", "--node", "A", "--node", "B", "training/run_ddp.py"]],
    ids=["help", "render"],
)
def test_help_and_render_import_only_what_they_use(argv: list[str]) -> None:
    """The command line imports a command's modules when it runs (issue 39: `--help` took 180 ms, twice
    what it did, as it imported the Python API, the follower and onboarding before it parsed)."""
    code = (
        "import sys; from hpcjob.cli import cli\n"
        f"try:\n    cli.main({argv!r}, standalone_mode=False)\nexcept SystemExit: pass\n"
        "unused = {'hpcjob.api', 'hpcjob.runner.attempts', 'hpcjob.azure.onboard', 'requests'}\n"
        "print(sorted(unused & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stderr[-2000:]


def test_the_runner_hands_on_every_name_from_the_room_that_has_it() -> None:
    import hpcjob.runner

    for name in hpcjob.runner.__all__:
        assert getattr(hpcjob.runner, name) is not None
    assert sorted(hpcjob.runner._rooms()) == sorted(hpcjob.runner.__all__)
    with pytest.raises(AttributeError):
        hpcjob.runner.no_such_name  # noqa: B018


def _commands() -> list[tuple[str, click.Command]]:
    """Every command and group of hpcjob, by its words, hpcjob itself first."""
    from hpcjob.cli import cli

    found: list[tuple[str, click.Command]] = []

    def walk(words: str, command: click.Command) -> None:
        found.append((words, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk(f"{words} {name}", sub)

    walk("hpcjob", cli)
    return found


def _help(words: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """`words --help` as an 80-column terminal shows it."""
    from hpcjob.cli import cli

    monkeypatch.setenv("COLUMNS", "80")
    result = CliRunner().invoke(cli, [*words.split()[1:], "--help"], prog_name="hpcjob")
    assert result.exit_code == 0, result.output
    return result.output


def test_hpcjob_help_fits_80_columns_and_cuts_no_command_short() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    commands = lines[lines.index("Commands:") + 1 : lines.index("", lines.index("Commands:"))]
    assert len(commands) > 10 and not [line for line in commands if line.endswith("...")], commands


def test_every_command_s_help_fits_80_columns_and_ends_with_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    for words, command in _commands():
        if words == "hpcjob emulator":  # its help is the emulator's own (argparse)
            continue
        lines = _help(words, monkeypatch).splitlines()
        assert max(map(len, lines)) <= 80, (words, max(lines, key=len))
        examples = lines[lines.index("Examples:") + 1 :]  # the last section, kept as written
        assert examples and all(line.startswith("  ") for line in examples), (words, examples)
        assert any(f" {words} " in f"{line} " for line in examples), (words, examples)
        if words != "hpcjob":  # a line of its group's list of commands, whole
            short = command.get_short_help_str(limit=80 - 6 - len("emulator"))
            assert len(short) <= 62 and not short.endswith("..."), (words, short)


def test_run_help_lists_each_option_once_under_its_heading_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcjob.cli import cli
    from hpcjob.cli.options import DATA, DATASETS, FAILURE, NODES, OTHER, OUTPUT, SHAPE, SHARE, SOFTWARE

    lines = _help("hpcjob run", monkeypatch).splitlines()
    headings = [line[:-1] for line in lines if line.endswith(":") and not line.startswith(" ")]
    assert headings == [SHAPE, NODES, DATA, DATASETS, SHARE, SOFTWARE, OUTPUT, FAILURE, OTHER, "Examples"]
    listed = [line.split()[0].rstrip(",") for line in lines if line.startswith("  -")]
    run = cli.get_command(click.Context(cli), "run")
    assert run is not None
    options = [p for p in run.get_params(click.Context(run)) if isinstance(p, click.Option)]
    assert sorted(listed) == sorted(p.opts[0] for p in options)  # each once, none left out


def test_every_option_of_a_command_in_sections_has_a_heading() -> None:
    """A new option of run, submit, render, mount, logs, cluster add or onboard names its heading (in
    GROUPS, or the command's `groups`): it is not left under "Other options" unseen."""
    from hpcjob.cli.options import HEADINGS, HelpCommand

    sectioned = {words for words, c in _commands() if isinstance(c, HelpCommand) and c.groups is not None}
    assert sectioned >= {f"hpcjob {w}" for w in ("run", "submit", "render", "mount", "logs", "cluster add")}
    for words, command in _commands():
        assert isinstance(command, HelpCommand | click.Group), words
        options = [p for p in command.get_params(click.Context(command)) if isinstance(p, click.Option)]
        if len(options) > 9:
            assert words in sectioned, f"{words} has {len(options)} options: give them headings"
        if words not in sectioned:
            continue
        assert isinstance(command, HelpCommand)
        for option in options:
            heading = command.heading(option)
            assert heading in HEADINGS, f"{words} {option.opts[-1]}: no heading (GROUPS, or the command's)"


def test_render_copy_to_puts_code_and_node_files_in_the_job_folder(script: Path, tmp_path: Path) -> None:
    mounted = tmp_path / "mounted-share"
    result = hpcjob("render", "--node", "A", "--copy-to", str(mounted), str(script))
    assert result.returncode == 0, result.stderr
    job_dir = mounted / "hpcjob" / getpass.getuser() / "train"
    library = [f".hpcjob/lib/hpctorch/{p.name}" for p in Path(hpctorch.__file__).parent.glob("*.py")]
    assert sorted(p.relative_to(job_dir).as_posix() for p in job_dir.rglob("*") if p.is_file()) == sorted(
        [
            ".hpcjob/datasets.py",
            ".hpcjob/env.py",
            ".hpcjob/manifest.json",
            ".hpcjob/node.sh",
            ".hpcjob/worker.py",
            "train.py",
            *library,
        ]
    )
    assert f"sent {5 + len(library)} file(s)" in result.stderr


def test_renders_of_one_job_folder_share_its_run_id_and_staging_starts_a_new_one(
    script: Path, tmp_path: Path
) -> None:
    """The by-hand flow renders the job file and the mount step in two calls: they must agree."""
    common = ["--node", "A", "--node", "B", "--share", "//HEAD/CcpSpoolDir/app", str(script)]

    def name_of(xml: str) -> str:
        return ET.fromstring(xml.encode()).get("Name") or ""

    staged = hpcjob("render", "--copy-to", str(tmp_path / "mounted"), *common)
    assert staged.returncode == 0, staged.stderr
    run_id = name_of(staged.stdout)
    assert (tmp_path / "mounted" / "hpcjob" / getpass.getuser() / "train" / "logs" / run_id).is_dir()
    mount = hpcjob("render", "--format", "clusrun", *common)
    assert mount.returncode == 0, mount.stderr
    assert f"/logs/{run_id}" in mount.stdout  # the mount step makes this run's log folder
    folder = f"hpcjob/{getpass.getuser()}/train"
    assert f"hpcjob: run {run_id}, the current run of job folder {folder}" in mount.stderr
    again = hpcjob("render", "--copy-to", str(tmp_path / "mounted"), *common)
    assert name_of(again.stdout) != run_id  # staged code is a new run
    assert name_of(hpcjob("render", *common).stdout) == name_of(again.stdout)
    other = hpcjob(
        "render", "--node", "A", "--share", "//HEAD/CcpSpoolDir/app", "--name", "other", str(script)
    )
    assert name_of(other.stdout) not in (run_id, name_of(again.stdout))  # another job folder


def test_a_run_id_that_ran_is_not_reused(script: Path, tmp_path: Path) -> None:
    staged = hpcjob("render", "--copy-to", str(tmp_path / "m"), "--node", "A", "--run-id", "r-9", str(script))
    assert staged.returncode == 0, staged.stderr
    for args in (
        ["render", "--copy-to", str(tmp_path / "m"), "--node", "A", "--run-id", "r-9", str(script)],
        ["run", "--local", "--mount-point", str(tmp_path / "local"), "--run-id", "r-9", str(script)],
    ):
        again = hpcjob(*args)
        assert again.returncode == 2
        assert again.stderr.startswith("hpcjob: error: run id 'r-9' is taken: a manual run has it")
        assert len(again.stderr.splitlines()) == 1


def test_each_command_is_imported_from_the_module_its_group_names_and_only_when_asked_for() -> None:
    """The command line imports a command's module when the command runs (hpcjob.cli.app.COMMAND_MODULES):
    every command of every module is in the table, at its module, and `hpcjob runs` imports no other."""
    import importlib

    from hpcjob.cli.app import COMMAND_MODULES

    code = (
        "import sys; from hpcjob.cli import cli; import click\n"
        "cli.get_command(click.Context(cli), 'runs')\n"
        "print(sorted(m for m in sys.modules if m.startswith('hpcjob.cli.')))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == str(["hpcjob.cli.app", "hpcjob.cli.options", "hpcjob.cli.runs"])

    from hpcjob.cli import cli

    for module in {m for modules in COMMAND_MODULES.values() for m in modules.values()}:
        importlib.import_module(f"hpcjob.cli.{module}")
    for name in COMMAND_MODULES:
        group = cli if name == "hpcjob" else cli.get_command(click.Context(cli), name)
        assert isinstance(group, click.Group)
        made = {
            command: found.callback.__module__ for command, found in group.commands.items() if found.callback
        }
        expected = {command: f"hpcjob.cli.{module}" for command, module in COMMAND_MODULES[name].items()}
        if name == "hpcjob":
            expected["cluster"] = "hpcjob.cli.app"  # the group itself
        assert made == expected
