"""A stand-in for the Docker command line (28.x), put on PATH as `docker` by the tests of `--image`.

It follows docker's command line, never hpcjob, as far as the node agent and hpcjob use it:
- `run` takes docker's own options only (the ones below; `--opt value` and `--opt=value`, `-id`), and
  refuses any other with docker's "unknown flag" and exit code 125, as it does a missing image, a name
  already in use and a --cidfile that exists; `-v SRC:DST[:MODE]` needs an absolute SRC and DST;
- the container's environment is the image's (its own PATH: nothing of the caller's), then `--env-file`
  lines as they are (quotes are not removed, `#` lines and blank lines skipped), then `-e`;
- `exec [-u USER] [-e K=V] [-w DIR] CONTAINER COMMAND...` runs COMMAND with that environment and the
  command's exit code; a USER the container does not know is refused with exit code 126. The container
  knows root, the users `useradd` made in it, and, where the host's /etc/passwd is mounted in it, the
  host's users (which the stand-in does not look up); `useradd` fails on a read-only /etc/passwd;
- `rm -f CONTAINER` removes it; `run` without -d runs its command at once (and `--rm` removes it after),
  passing SIGINT and SIGTERM on to it, as docker's signal proxy does.
What it does not do: isolate. A "container" runs its commands on this machine, as the caller, seeing its
files: the tests check what crosses into a container (options, variables, volumes), not a file system.

Images are a JSON file, $FAKE_DOCKER_IMAGES: {"NAME": {"env": {"PATH": ..., ...}, "workdir": "/"}}.
Containers are JSON files in $FAKE_DOCKER_STATE. Every call's arguments are logged to $FAKE_DOCKER_LOG.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

STATE = Path(os.environ.get("FAKE_DOCKER_STATE", "/nonexistent"))  # set by whoever puts it on PATH
# `docker run`'s options that hpcjob or the agent may give: with a value, and flags.
RUN_VALUED = {
    *("--name", "--network", "--net", "--ipc", "--ulimit", "--gpus", "--device", "-v", "--volume"),
    *("--env-file", "--cidfile", "--cpuset-cpus", "-e", "--env", "-w", "--workdir", "-u", "--user"),
    *("--shm-size", "--cap-add", "--entrypoint", "--runtime", "--security-opt", "--label", "-l"),
}
RUN_FLAGS = {"-i", "--interactive", "-d", "--detach", "-t", "--tty", "--rm", "--privileged", "--init"}
EXEC_VALUED = {"-u", "--user", "-e", "--env", "-w", "--workdir"}
EXEC_FLAGS = {"-i", "--interactive", "-t", "--tty", "-d", "--detach"}


def fail(message: str, code: int) -> NoReturn:
    sys.stderr.write(message + "\n")
    sys.exit(code)


def parse(
    args: list[str], valued: set[str], flags: set[str], command: str
) -> tuple[list[tuple[str, str]], list[str]]:
    """docker's option parsing: options first, then the positional arguments, all of them as given."""
    options: list[tuple[str, str]] = []
    index = 0
    while index < len(args) and args[index].startswith("-") and args[index] != "-":
        word = args[index]
        name, equals, value = word.partition("=")
        if not name.startswith("--") and len(name) > 2 and not equals:  # -id: combined short flags
            letters = [f"-{letter}" for letter in name[1:]]
            if all(letter in flags for letter in letters):
                options += [(letter, "") for letter in letters]
                index += 1
                continue
        if name in flags and not equals:
            options.append((name, ""))
        elif name in valued:
            if not equals:
                index += 1
                if index == len(args):
                    fail(f"flag needs an argument: {name}\nSee 'docker {command} --help'.", 125)
                value = args[index]
            options.append((name, value))
        else:
            fail(f"unknown flag: {name}\nSee 'docker {command} --help'.", 125)
        index += 1
    return options, args[index:]


def container_path(name: str) -> Path:
    return STATE / f"{name}.json"


def find(name_or_id: str) -> dict[str, Any]:
    for path in STATE.glob("*.json"):
        container = json.loads(path.read_text())
        if name_or_id in (container["name"], container["id"]):
            return container
    fail(f"Error response from daemon: No such container: {name_or_id}", 1)


def read_env_file(path: str) -> dict[str, str]:
    env: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except OSError as err:
        fail(f"docker: open {path}: {err.strerror}.", 125)
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, equals, value = line.partition("=")
        if equals:
            env[key] = value  # as it is: docker removes no quotes
        elif key in os.environ:
            env[key] = os.environ[key]
    return env


def run(args: list[str]) -> int:
    options, rest = parse(args, RUN_VALUED, RUN_FLAGS, "run")
    if not rest:
        fail("docker: 'docker run' requires at least 1 argument.", 125)
    image, command = rest[0], rest[1:]
    images = json.loads(Path(os.environ["FAKE_DOCKER_IMAGES"]).read_text())
    if image not in images:
        fail(
            f"Unable to find image '{image}' locally\ndocker: Error response from daemon: pull access "
            f"denied for {image.split(':')[0]}, repository does not exist or may require 'docker login'.",
            125,
        )
    env = dict(images[image].get("env", {}))
    volumes: list[str] = []
    for name, value in options:
        if name == "--env-file":
            env.update(read_env_file(value))
        elif name in ("-e", "--env"):
            key, equals, given = value.partition("=")
            env[key] = given if equals else os.environ.get(key, "")
        elif name in ("-v", "--volume"):
            parts = value.split(":")
            if len(parts) not in (2, 3) or not all(part.startswith("/") for part in parts[:2]):
                fail(f"docker: Error response from daemon: invalid volume specification: '{value}'.", 125)
            volumes.append(value)
    given = dict(options)
    name = given.get("--name") or secrets.token_hex(6)
    if container_path(name).exists():
        fail(
            f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in use.',
            125,
        )
    cidfile = given.get("--cidfile")
    if cidfile and os.path.exists(cidfile):
        fail(
            "docker: Container ID file found, make sure the other container isn't running or delete "
            f"{cidfile}.",
            125,
        )
    container = {
        "id": secrets.token_hex(32),
        "name": name,
        "image": image,
        "env": env,
        "volumes": volumes,
        "options": options,
        "workdir": given.get("-w") or given.get("--workdir") or images[image].get("workdir", "/"),
        "users": ["root"],
    }
    STATE.mkdir(parents=True, exist_ok=True)
    save(container)
    if cidfile:
        Path(cidfile).write_text(container["id"])
    if "-d" in given or "--detach" in given:
        print(container["id"])
        return 0
    entrypoint = given.get("--entrypoint")
    command = [entrypoint, *command] if entrypoint else command  # the image's own has none here
    try:
        user = given.get("-u") or given.get("--user") or "root"
        return run_in(container, command, user, {}, container["workdir"])
    finally:
        if "--rm" in given:
            container_path(name).unlink(missing_ok=True)


def save(container: dict[str, Any]) -> None:
    """A container's state, whole or not at all, as the daemon keeps it: another task's `docker rm` reads
    every container's at once (a file half written would fail it, leaving its own container behind)."""
    path = container_path(container["name"])
    part = path.with_name(f".{path.name}.{os.getpid()}")
    part.write_text(json.dumps(container))
    os.replace(part, path)


def run_in(
    container: dict[str, Any], command: list[str], user: str, extra: dict[str, str], workdir: str
) -> int:
    """A command in the container: its environment alone; signals passed on."""
    passwd_mounted = any(v.split(":")[1] == "/etc/passwd" for v in container["volumes"])
    if command[:1] == ["useradd"]:
        if any(v.split(":")[1] == "/etc/passwd" and v.endswith(":ro") for v in container["volumes"]):
            fail("useradd: cannot lock /etc/passwd; try again later.", 1)
        container["users"].append(command[-1])
        save(container)
        return 0
    if command[:1] == ["chown"]:
        return 0
    known = user in container["users"] or user.split(":")[0].isdigit() or passwd_mounted
    if not known:
        fail(f"unable to find user {user}: no matching entries in passwd file", 126)
    child = subprocess.Popen(command, env={**container["env"], **extra}, cwd=workdir)
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, lambda signum, frame: child.send_signal(signum))
    return child.wait()


def execute(args: list[str]) -> int:
    options, rest = parse(args, EXEC_VALUED, EXEC_FLAGS, "exec")
    if len(rest) < 2:
        fail("docker: 'docker exec' requires at least 2 arguments.", 1)
    container = find(rest[0])
    extra = {}
    user, workdir = "root", container["workdir"]
    for name, value in options:
        if name in ("-e", "--env"):
            key, equals, given = value.partition("=")
            extra[key] = given if equals else os.environ.get(key, "")
        elif name in ("-u", "--user"):
            user = value
        elif name in ("-w", "--workdir"):
            workdir = value
    return run_in(container, rest[1:], user, extra, workdir)


def remove(args: list[str]) -> int:
    options, names = parse(args, set(), {"-f", "--force"}, "rm")
    for name in names:
        for path in STATE.glob("*.json"):
            if name in (json.loads(path.read_text())["name"], json.loads(path.read_text())["id"]):
                path.unlink()
                break
        else:
            if not options:
                fail(f"Error response from daemon: No such container: {name}", 1)
        print(name)
    return 0


def main() -> int:
    args = sys.argv[1:]
    with open(os.environ.get("FAKE_DOCKER_LOG", os.devnull), "a") as log:
        log.write(json.dumps(args) + "\n")
    commands = {"run": run, "exec": execute, "rm": remove}
    if not args or args[0] not in commands:
        fail(f"docker: unknown command: docker {' '.join(args[:1])}", 1)
    return commands[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
