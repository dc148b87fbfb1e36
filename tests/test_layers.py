"""The house's layers, read from the code's own imports (every `import` of a module, at its top, in a
function, or for type checking alone): CLI -> backends/render/config/runs -> the pure core, one way."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hpcjob"
# The pure core: what the user asks for, turned into the job. No I/O: nothing that reaches a disk, a
# process or a network is imported there (jinja2 and importlib: the render's templates, package data).
CORE = {"hpcjob.spec", "hpcjob.plan", "hpcjob.torchrun", "hpcjob.render", "hpcjob.render.job_xml",
        "hpcjob.render.text", "hpcjob.results", "hpcjob.fabric", "hpcjob.hangs"}  # fmt: skip
CORE_MAY_IMPORT = {
    *("__future__", "collections", "dataclasses", "pathlib", "re", "hashlib", "typing", "shlex", "fnmatch"),
    *("xml", "base64", "functools", "gzip", "json", "enum", "signal", "jinja2", "importlib", "math"),
    "hpcjob.node.mount_filter",  # the node-side filter's request format: its constants, run nowhere
}


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
            # from hpcjob.node import mount_filter: a module; from hpcjob.plan import make_plan: hpcjob.plan
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith("hpcjob"):
                while name not in known:  # from hpcjob.plan import make_plan: hpcjob.plan
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


def test_the_pure_core_imports_nothing_that_does_i_o() -> None:
    wrong = {name: sorted(GRAPH[name] - CORE - CORE_MAY_IMPORT) for name in CORE}
    assert {name: found for name, found in wrong.items() if found} == {}


def test_nothing_below_the_command_line_imports_it() -> None:
    below = {name for name in GRAPH if not name.startswith("hpcjob.cli")}
    assert {name: sorted(t for t in GRAPH[name] if t.startswith("hpcjob.cli")) for name in below} == {
        name: [] for name in below
    }


def test_a_backend_reaches_no_other_backend_but_the_shared_scheduler_code() -> None:
    backends = {name for name in GRAPH if name.startswith("hpcjob.backends.")}
    shared = {"hpcjob.backends", "hpcjob.backends.scheduler"}
    crossing = {name: sorted((GRAPH[name] & backends) - shared) for name in backends}
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
