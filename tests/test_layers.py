"""The house's layers, read from the code's own imports (every `import` of a module, at its top, in a
function, or for type checking alone): each room imports its own floor and the floors below it, never one
above (DESIGN.md: CLI -> runner -> backends -> store -> the pure core)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hpcjob"
# The floors, from the bottom up: a module's floor is that of the longest prefix of its name here.
FLOORS: dict[str, int] = {
    "hpcjob.job": 0,  # the pure core: spec -> plan -> render, results; no I/O
    "hpcjob.node.mount_filter": 0,  # the node-side filter's request format: its constants, run nowhere
    "hpcjob.extras": 1,  # which optional parts are installed
    "hpcjob.store": 1,  # what lives on disk or on the share
    "hpcjob.backends": 2,
    "hpcjob.runner": 3,
    "hpcjob.checks": 4,  # doctor's steps, through the runner like any job
    "hpcjob.azure": 4,  # onboarding: the template, its steps and `az` (the size table is the core's)
    "hpcjob.api": 5,
    "hpcjob.cli": 6,
    "hpcjob": 7,  # the package hands the Python API on
}
# Beside the floors: what runs on the nodes imports nothing of the client; the emulator (a head node for
# the tests) reaches only the node files and the local backend's process helpers, and only the command
# line (`hpcjob cluster emulate`) reaches it.
NODE = "hpcjob.node"
EMULATOR = "hpcjob.emulator"
EMULATOR_MAY_IMPORT = {"hpcjob.node", "hpcjob.backends.local.procs"}
# The pure core: no I/O: nothing that reaches a disk, a process or a network is imported there (jinja2
# and importlib: the render's templates, package data).
CORE_MAY_IMPORT = {
    *("__future__", "collections", "dataclasses", "pathlib", "re", "hashlib", "typing", "shlex", "fnmatch"),
    *("xml", "base64", "functools", "gzip", "json", "enum", "signal", "jinja2", "importlib", "math"),
}


def floor(name: str) -> int | None:
    """The floor of module `name` (None: the node files and the emulator, beside the floors)."""
    if name.startswith((NODE, EMULATOR)) and name != "hpcjob.node.mount_filter":
        return None
    prefixes = [p for p in FLOORS if name == p or name.startswith(f"{p}.")]
    return FLOORS[max(prefixes, key=len)]


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The modules `path` imports: hpcjob's by their module name, others by their top-level name."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # from hpcjob.node import mount_filter: a module; from hpcjob.job.plan import make_plan: not
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith("hpcjob"):
                while name not in known:  # from hpcjob.job.plan import make_plan: hpcjob.job.plan
                    name = name.rsplit(".", 1)[0]
                yield name
            else:
                yield name.split(".")[0]


GRAPH = {name: set(imports(path, modules())) - {name} for name, path in modules().items()}


def test_no_module_imports_itself_back_through_others() -> None:
    def circle_from(start: str, at: str, seen: tuple[str, ...]) -> tuple[str, ...] | None:
        for target in sorted(GRAPH.get(at, ())):
            if target == start:
                return (*seen, target)
            if target in GRAPH and target not in seen:
                found = circle_from(start, target, (*seen, target))
                if found:
                    return found
        return None

    packages = {name for name in GRAPH if not name.startswith("hpcjob.emulator")}
    # A package's own __init__ imports its modules, and they import the package: not a circle of layers.
    circles = []
    for name in sorted(packages):
        found = circle_from(name, name, (name,))
        if found and not all(step.startswith(name) or name.startswith(step) for step in found):
            circles.append(" -> ".join(found))
    assert circles == []


def test_every_module_has_a_floor_or_a_place_beside_them() -> None:
    homeless = [n for n in GRAPH if floor(n) is None and not n.startswith((NODE, EMULATOR))]
    assert homeless == []


def test_no_module_imports_from_a_floor_above_its_own() -> None:
    upward = {
        name: sorted(
            t for t in GRAPH[name] if t.startswith("hpcjob") and (floor(t) or 0) > (floor(name) or 0)
        )
        for name in GRAPH
        if floor(name) is not None
    }
    assert {name: found for name, found in upward.items() if found} == {}


def test_the_floors_reach_the_node_files_and_the_emulator_as_allowed() -> None:
    crossing = {}
    for name, targets in GRAPH.items():
        hpcjob = {t for t in targets if t.startswith("hpcjob")}
        if name.startswith(NODE) and name != "hpcjob.node.mount_filter":
            wrong = hpcjob - {t for t in hpcjob if t.startswith(NODE)}  # runs alone on a node
        elif name.startswith(EMULATOR):
            wrong = {t for t in hpcjob if not t.startswith((EMULATOR, *EMULATOR_MAY_IMPORT))}
        else:
            allowed_emulator = name.startswith("hpcjob.cli")
            wrong = {t for t in hpcjob if t.startswith(EMULATOR) and not allowed_emulator}
            # the client reads the node files as package data; it imports only the filter's constants
            wrong |= {t for t in hpcjob if t.startswith(NODE) and t != "hpcjob.node.mount_filter"}
        if wrong:
            crossing[name] = sorted(wrong)
    assert crossing == {}


def test_the_pure_core_imports_nothing_that_does_i_o() -> None:
    core = {name for name in GRAPH if name.startswith("hpcjob.job")}
    assert "hpcjob.job.plan" in core and "hpcjob.job.render.text" in core
    allowed = core | CORE_MAY_IMPORT | {"hpcjob.node.mount_filter"}  # the filter's constants
    wrong = {name: sorted(GRAPH[name] - allowed) for name in core}
    assert {name: found for name, found in wrong.items() if found} == {}


def test_nothing_below_the_command_line_imports_it() -> None:
    below = {name for name in GRAPH if not name.startswith("hpcjob.cli")}
    assert {name: sorted(t for t in GRAPH[name] if t.startswith("hpcjob.cli")) for name in below} == {
        name: [] for name in below
    }


def test_a_backend_reaches_no_other_backend_but_the_shared_scheduler_code() -> None:
    """One module (or package, with its helpers) per backend; they share the protocol and registry
    (hpcjob.backends) and the scheduler code, nothing else."""

    def backend(name: str) -> str | None:  # hpcjob.backends.local.procs: local
        parts = name.split(".")
        return parts[2] if len(parts) > 2 and parts[:2] == ["hpcjob", "backends"] else None

    shared = {"scheduler"}
    crossing = {
        name: sorted(t for t in GRAPH[name] if backend(t) not in (None, backend(name), *shared))
        for name in GRAPH
        if backend(name) is not None
    }
    assert "hpcjob.backends.local.procs" in GRAPH and "hpcjob.backends.rest" in GRAPH
    assert {name: found for name, found in crossing.items() if found} == {}


def test_a_command_module_reaches_no_other_command_module() -> None:
    """The CLI's command modules share only the command tree, the options and the tables; the work is
    below them (hpcjob.runner)."""
    shared = {"hpcjob.cli", "hpcjob.cli.app", "hpcjob.cli.options", "hpcjob.cli.tables"}
    commands = {name for name in GRAPH if name.startswith("hpcjob.cli.")} - shared
    crossing = {name: sorted((GRAPH[name] & commands) - {name}) for name in commands}
    assert {name: found for name, found in crossing.items() if found} == {}


def test_the_command_line_reaches_the_backends_through_the_runner_alone() -> None:
    """`run --local` and `submit --wait` take the same path: no command opens a backend of its own."""
    cli = {name for name in GRAPH if name.startswith("hpcjob.cli")}
    found = {name: sorted(t for t in GRAPH[name] if t.startswith("hpcjob.backends")) for name in cli}
    assert {name: targets for name, targets in found.items() if targets} == {}


def test_the_python_api_reaches_the_work_through_the_runner_alone() -> None:
    below = {t for t in GRAPH["hpcjob.api"] if t.startswith("hpcjob.")}
    assert sorted(t for t in below if t.startswith(("hpcjob.backends", "hpcjob.cli"))) == []
    assert "hpcjob.runner" in below


def test_the_client_never_unpickles_a_file() -> None:
    """Files on the share are anyone's who may write there (issue 31): only the nodes' own worker.py,
    in a rank's process, touches a pickle (its own flight-recorder trace)."""
    known = modules()
    users = [
        name for name, path in known.items()
        if not name.startswith("hpcjob.node.") and any("pickle" in i for i in imports(path, known))
    ]  # fmt: skip
    assert users == []
