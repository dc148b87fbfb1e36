"""Red-team battery: bad input to every command, each refused the way the project rule says.

The rule (docs/options.md, "Bad input exits 2 with one line that names the problem, before anything is
started"; hpcjob/cli/app.py): bad input gets ONE line on stderr starting with `hpcjob: error: `, and a
non-zero exit: 2 for the user's bad input (bad options, values, files, unknown profiles), 1 for a
cluster, share or network failure, 130 for an interrupt. No Python traceback, nothing on stdout, and
nothing half-done left behind: no file written, no profile saved, no run recorded. No password may
appear in any output.

Each case runs `python -m hpcjob.cli ARGV` in a fresh folder with its own config file, state, data
and home, stdin from /dev/null (no terminal: nothing can prompt), and checks all of that. Expected exit
codes follow the rule, not what the code does today: a failing case is a finding.

Guards, so that a case the CLI fails to refuse cannot hurt the machine or hang the suite:
- `torch` is shadowed (PYTHONPATH) by a stub that exits at once, so no case ever runs real torchrun;
- the address space is capped (a node count of 10**20 must not eat the machine's memory);
- every case has a 30 s limit, and its whole process group is killed past it.
The cluster profile's REST URL is https://127.0.0.1:1: nothing answers there. Cases that can only be
refused after a request (the client retries reads for 60 s) are marked slow.
"""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

TIMEOUT_S = 30
# In every case's environment, named by the profiles below: must never be printed.
PROFILE_PASSWORD = "Pr0file-Passw0rd-xyzzy"
SECRET = "hunter2-Sekr1t"  # what a careless user types where a password does not belong
ERROR = "hpcjob: error: "
WARNING = "hpcjob: warning: "
# A line that a terminal or a log shows as one clean line: no control characters, no line separators.
_UNCLEAN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
MEMORY_LIMIT = 1 << 30


@dataclasses.dataclass(frozen=True)
class Link:
    """A symbolic link to `target`, among a case's files."""

    target: str


# Profiles. The REST URL answers nothing; the password comes from the environment
# (TWO_CLUSTERS: no default; NO_PASSWORD_VARIABLE: the variable it names is unset).
ONE_CLUSTER = r"""default = "lab"

[clusters.lab]
url = "https://127.0.0.1:1"
user = 'LAB\alice'
password = "env:HPCJOB_TEST_PASSWORD"
share = "//HEADNODE/CcpSpoolDir/app"
node_group = "GPUNodes"
"""
TWO_CLUSTERS = r"""[clusters.lab]
url = "https://127.0.0.1:1"
user = 'LAB\alice'
password = "env:HPCJOB_TEST_PASSWORD"

[clusters.dev]
url = "https://127.0.0.1:2"
user = 'LAB\bob'
password = "env:HPCJOB_TEST_PASSWORD"
"""
NO_PASSWORD_VARIABLE = r"""[clusters.lab]
url = "https://127.0.0.1:1"
user = 'LAB\alice'
password = "env:HPCJOB_UNSET_PASSWORD"
"""
PROMPTING = r"""[clusters.lab]
url = "https://127.0.0.1:1"
user = 'LAB\alice'
password = "prompt"
"""

# Runs recorded on this machine (XDG_STATE_HOME is <tmp>/state) and their logs in a local share.
RUNS = "state/hpcjob/store/runs.jsonl"
LOCAL_RUN = (
    '{"run_id": "train-1", "name": "train", "backend": "local", "job_folder": "hpcjob/train", '
    '"nodes": ["LOCAL1", "LOCAL2"], "local_root": "share"}\n'
)
# Rendered and copied by hand (`render --copy-to`): never submitted from here.
MANUAL_RUN = (
    '{"run_id": "train-3", "name": "train", "backend": "manual", "job_folder": "hpcjob/train", '
    '"nodes": ["GPU1"], "local_root": "share"}\n'
)
REST_RUN_OF_A_GONE_CLUSTER = (
    '{"run_id": "train-2", "name": "train", "backend": "rest", "job_folder": "hpcjob/train", '
    '"nodes": ["GPU1"], "share": "//HEADNODE/CcpSpoolDir/app", "job_id": "42", "cluster": "gone"}\n'
)
# A local run that has ended: both nodes wrote their exit code.
ENDED_RUN: dict[str, str | bytes | Link | None] = {
    RUNS: LOCAL_RUN,
    **{
        f"share/hpcjob/train/logs/train-1/{node}.{kind}": text
        for node in ("LOCAL1", "LOCAL2")
        for kind, text in (("out", f"hello from {node}\n"), ("err", ""), ("exit", "0 1700000000\n"))
    },
}


@dataclasses.dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    code: int = 2
    config: str | bytes | None = None  # clusters.toml ($HPCJOB_CONFIG), absent when None
    files: Mapping[str, str | bytes | Link | None] = dataclasses.field(default_factory=dict)  # None: a dir
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    warning: str = ""  # why a `hpcjob: warning:` line may come before the error line


def case(
    case_id: str,
    argv: str | list[str] = "",
    code: int = 2,
    slow: bool = False,
    config: str | bytes | None = None,
    files: Mapping[str, str | bytes | Link | None] | None = None,
    env: Mapping[str, str] | None = None,
    secrets: tuple[str, ...] = (),
    warning: str = "",
) -> object:
    """One case; `argv` is a string split at spaces, or the list itself when a value holds a space."""
    marks = [pytest.mark.slow] if slow else []
    args = tuple(argv.split()) if isinstance(argv, str) else tuple(argv)
    bad = Case(args, code, config, files or {}, env or {}, secrets, warning)
    return pytest.param(bad, id=case_id, marks=marks)


S = "code/train.py"  # a good script; every case has it
EMULATOR_PASSWORD = {"HPCJOB_EMULATOR_PASSWORD": SECRET}

CASES = [
    # --- the command line itself, --version and --help misused -------------------------------------
    case("no-command"),
    case("unknown-command", f"rende {S}"),
    case("version-with-value", "--version=1"),
    case("cluster-without-subcommand", "cluster"),
    # --- render: the script -------------------------------------------------------------------------
    case("render-without-script", "render --node A"),
    case("render-missing-script", "render --node A code/nope.py"),
    case("render-script-is-a-directory", "render --node A code/dir.py", files={"code/dir.py": None}),
    case(
        "render-script-name-with-space",
        ["render", "--node", "A", "code/my train.py"],
        files={"code/my train.py": "print(1)\n"},
    ),
    case(
        "render-script-name-unicode",
        ["render", "--node", "A", "code/tr\u00e4in.py"],
        files={"code/tr\u00e4in.py": "print(1)\n"},
    ),
    case("render-options-after-the-script-are-the-scripts", f"render {S} --node A"),
    case("render-script-arg-escape-sequence", ["render", "--node", "A", S, "\x1b[2J"]),
    # --- render: every format -----------------------------------------------------------------------
    case("render-format-unknown", f"render --format yaml --node A {S}"),
    case("render-xml-without-node", f"render --format xml {S}"),
    case("render-clusrun-without-share", f"render --format clusrun --node A {S}"),
    case("render-powershell-n-zero", f"render --format powershell -n 0 --node A {S}"),
    case("render-json-duplicate-nodes-ignoring-case", f"render --format json --node gpu1 --node GPU1 {S}"),
    # --- render: numbers ----------------------------------------------------------------------------
    case("render-n-negative", f"render -n -1 --node A {S}"),
    case("render-n-huge", f"render -n 99999999999999999999 --node A {S}"),
    case("render-nproc-huge", f"render --nproc-per-node 99999999999999999999 --node A {S}"),
    case("render-gpus-fewer-than-nproc", f"render --gpus-per-node 2 --nproc-per-node 4 --node A {S}"),
    case("render-rdzv-port-zero", f"render --rdzv-port 0 --node A {S}"),
    case("render-command-limit-zero", f"render --command-limit 0 --node A {S}"),
    # --- render: node names -------------------------------------------------------------------------
    case("render-node-with-space", ["render", "--node", "GPU 1", S]),
    case("render-node-fqdn", f"render --node gpu1.contoso.com {S}"),
    case("run-node-a-count", f"run --local --node 2 {S}"),  # -n 2 was meant
    case("render-node-unicode", ["render", "--node", "GP\u00dc1", S]),
    case("render-node-newline", ["render", "--node", "GPU1\nGPU2", S]),
    case("render-node-carriage-return", ["render", "--node", "GPU1\r", S]),
    case("render-node-del-char", ["render", "--node", "GPU\x7f", S]),
    case("render-node-line-separator", ["render", "--node", "GPU1\u2028GPU2", S]),
    case("render-node-looks-like-an-option", f"render --node --name {S}"),
    # --- render: names, paths and text options -------------------------------------------------------
    case("render-name-too-long", f"render --name {'n' * 59} --node A {S}"),
    case("render-name-empty", ["render", "--name", "", "--node", "A", S]),
    case("render-run-id-with-slash", f"render --run-id a/b --node A {S}"),
    case("render-run-id-too-long", f"render --run-id {'r' * 81} --node A {S}"),
    case("render-run-id-empty", ["render", "--run-id", "", "--node", "A", S]),
    case("render-python-with-space", ["render", "--python", "python3 -u", "--node", "A", S]),
    case("render-mount-point-empty", ["render", "--mount-point", "", "--node", "A", S]),
    # --- render: environment, mount options, share ---------------------------------------------------
    case("render-env-without-equals", f"render --env FOO --node A {S}"),
    case("render-env-secret-password", f"render --env DB_PASSWORD={SECRET} --node A {S}", secrets=(SECRET,)),
    case(
        "render-env-url-with-credentials",
        f"render --env PIP_INDEX_URL=https://alice:{SECRET}@pkgs.contoso.com/simple --node A {S}",
        secrets=(SECRET,),
    ),
    case(  # nothing in the run history either
        "run-local-env-url-with-token",
        f"run --local --env PIP_EXTRA_INDEX_URL=https://{SECRET}@pkgs.contoso.com/simple {S}",
        secrets=(SECRET,),
    ),
    case(
        "render-mount-options-password",
        f"render --mount-options vers=3.0,password={SECRET} --node A {S}",
        secrets=(SECRET,),
    ),
    case(
        "render-mount-options-password-with-punctuation",
        f"render --mount-options vers=3.0,password={SECRET}! --node A {S}",
        secrets=(SECRET,),
    ),
    case(
        "render-mount-options-upper-case-password",
        f"render --mount-options vers=3.0,PASSWORD={SECRET} --node A {S}",
        secrets=(SECRET,),
    ),
    case("render-share-not-unc", f"render --share /mnt/share --node A {S}"),
    case(
        "render-share-with-credentials",
        f"render --share //alice:{SECRET}@HEAD/share --node A {S}",
        secrets=(SECRET,),
    ),
    # --- render: --upload and --copy-to ----------------------------------------------------------------
    case("render-upload-without-share", f"render --upload --node A {S}"),
    case("render-upload-and-copy-to", f"render --upload --share //HEAD/share --copy-to out --node A {S}"),
    case("render-copy-to-under-a-file", f"render --copy-to {S}/sub --node A {S}"),
    case("render-copy-to-empty", ["render", "--copy-to", "", "--node", "A", S]),
    case(
        "render-upload-smb-port-zero",
        f"render --upload --share //127.0.0.1/share --smb-port 0 --node A {S}",
        env={"HPCJOB_SMB_USER": "alice", "HPCJOB_SMB_PASSWORD": SECRET},
        secrets=(SECRET,),
    ),
    case(
        "render-upload-smb-port-70000",
        f"render --upload --share //127.0.0.1/share --smb-port 70000 --node A {S}",
        env={"HPCJOB_SMB_USER": "alice", "HPCJOB_SMB_PASSWORD": SECRET},
        secrets=(SECRET,),
    ),
    # --- run --local (a stub shadows torch: a job that starts anyway ends at once) ---------------------
    case("run-without-local", f"run {S}"),
    case("run-local-n-zero", f"run --local -n 0 {S}"),
    # Refused, or the node list alone fills the 1 GiB address-space cap (in about 3 s).
    case("run-local-n-huge", f"run --local -n 99999999999999999999 {S}"),
    case("run-local-nproc-huge", f"run --local --nproc-per-node 99999999999999999999 {S}"),
    case("run-local-rdzv-port-zero", f"run --local --rdzv-port 0 {S}"),
    case("run-local-min-nodes-above-nodes", f"run --local -n 2 --min-nodes 3 --max-restarts 1 {S}"),
    case("run-local-elastic-without-restarts", f"run --local -n 3 --min-nodes 2 {S}"),
    case("run-local-tag-without-value", f"run --local -n 2 --tag exp {S}"),
    case("runs-since-not-a-time", "runs --since yesterday"),
    case("runs-show-unknown", "runs show nope"),
    case("run-local-command-limit-zero", f"run --local --command-limit 0 {S}"),
    case("run-local-grace-period-negative", f"run --local --grace-period -1 {S}"),
    case("run-local-grace-period-nan", f"run --local --grace-period nan {S}"),
    case("run-local-mount-point-is-a-file", f"run --local --mount-point {S} {S}"),
    case("run-local-json-bad-run-id", f"run --local --json --run-id a/b {S}"),
    # --- submit: which cluster ------------------------------------------------------------------------
    case("submit-no-cluster-configured", f"submit --node A {S}"),
    case("submit-several-clusters-no-default", f"submit --dry-run --node A {S}", config=TWO_CLUSTERS),
    case("submit-cluster-unknown", f"submit --cluster nope --node A {S}", config=ONE_CLUSTER),
    case(
        "submit-cluster-empty", ["submit", "--dry-run", "--cluster", "", "--node", "A", S], config=ONE_CLUSTER
    ),
    case(
        "submit-cluster-looks-like-an-option", f"submit --cluster --dry-run --node A {S}", config=ONE_CLUSTER
    ),
    case("submit-password-variable-unset", f"submit --node A {S}", config=NO_PASSWORD_VARIABLE),
    case("submit-prompt-without-terminal", f"submit --node A {S}", config=PROMPTING),
    # --- submit: a broken clusters.toml -------------------------------------------------------------
    case("submit-config-bad-toml", f"submit --dry-run --node A {S}", config="[clusters.lab\nurl=\n"),
    case(
        "submit-config-url-is-a-number",
        f"submit --dry-run --node A {S}",
        config="[clusters.lab]\nurl = 5\nuser = 'alice'\n",
    ),
    case(
        "submit-config-not-utf8",
        f"submit --dry-run --node A {S}",
        config=b"[clusters.lab]\nurl = 'https://h'\nuser = '\xff\xfe'\n",
    ),
    case(
        "submit-config-holds-a-password",
        f"submit --dry-run --node A {S}",
        config=f"[clusters.lab]\nurl = 'https://h'\nuser = 'alice'\npassword = '{SECRET}'\n",
        secrets=(SECRET,),
    ),
    # --- submit: the job (--dry-run sends nothing; without it, refused before any request) -------------
    case("submit-dry-run-without-node", f"submit --dry-run {S}", config=ONE_CLUSTER),
    case(
        "submit-dry-run-share-not-unc", f"submit --dry-run --share C:\\share --node A {S}", config=ONE_CLUSTER
    ),
    case(
        "submit-dry-run-env-secret",
        f"submit --dry-run --env AWS_SECRET_ACCESS_KEY={SECRET} --node A {S}",
        config=ONE_CLUSTER,
        secrets=(SECRET,),
    ),
    case(
        "submit-dry-run-mount-options-password",
        f"submit --dry-run --mount-options password={SECRET},vers=3.0 --node A {S}",
        config=ONE_CLUSTER,
        secrets=(SECRET,),
    ),
    case("submit-dry-run-smb-port-zero", f"submit --dry-run --smb-port 0 --node A {S}", config=ONE_CLUSTER),
    case(
        "submit-dry-run-script-not-py",
        "submit --dry-run --node A code/train.sh",
        config=ONE_CLUSTER,
        files={"code/train.sh": "echo\n"},
    ),
    # --- status, cancel, nodes ----------------------------------------------------------------------
    case("status-no-cluster-configured", "status 42"),
    case("status-unknown-cluster", "status 42 --cluster nope", config=ONE_CLUSTER),
    case("status-superscript-digit-id", "status \u00b2", config=ONE_CLUSTER),
    # Refused, or sent to a head node that does not answer: the client retries for 60 s.
    case("status-job-id-zero", "status 0", config=ONE_CLUSTER),
    case("status-run-not-submitted", "status train-3", config=ONE_CLUSTER, files={RUNS: MANUAL_RUN}),
    case("cancel-garbage-id", ["cancel", "; rm -rf /"], config=ONE_CLUSTER),
    case("cancel-superscript-digit-id", "cancel \u00b9\u00b2", config=ONE_CLUSTER),
    case("nodes-no-cluster-configured", "nodes"),
    case("nodes-password-variable-unset", "nodes", config=NO_PASSWORD_VARIABLE),
    case(
        "nodes-insecure-password-variable-unset",
        "nodes",
        config=NO_PASSWORD_VARIABLE + "insecure = true\n",
        # docs: "--insecure warns every time it is used": hpcjob warns as it connects, before it
        # looks for the password.
        warning="the profile is insecure: hpcjob warns on every use of it",
    ),
    case("nodes-group-with-semicolon", "nodes --group GPU;reboot", config=ONE_CLUSTER),
    # --- logs ---------------------------------------------------------------------------------------
    case("logs-unknown-run", "logs train-9"),
    case("logs-run-id-with-slash", "logs ../etc"),
    case("logs-share-without-job-folder", "logs train-1 --share //HEAD/share"),
    case("logs-node-unknown", "logs train-1 --node NOPE", files=ENDED_RUN),
    case(
        "logs-node-unknown-with-mount-point",
        "logs train-1 --mount-point share --job-folder hpcjob/train --node NOPE",
        files=ENDED_RUN,
    ),
    case("logs-node-invalid-name", ["logs", "train-1", "--node", "a b\n"], files=ENDED_RUN),
    case("logs-mount-point-missing", "logs train-1 --mount-point nowhere --job-folder hpcjob/train"),
    case("logs-mount-point-is-a-file", f"logs train-1 --mount-point {S} --job-folder hpcjob/train"),
    case(
        "logs-job-folder-dot-dot",
        "logs train-1 --mount-point share --job-folder ../../etc",
        files=ENDED_RUN,
    ),
    case("logs-poll-zero", "logs train-1 --follow --poll 0", files=ENDED_RUN),
    case("logs-poll-negative", "logs train-1 --poll -1", files=ENDED_RUN),
    case("logs-idle-timeout-negative", "logs train-1 --idle-timeout -5", files=ENDED_RUN),
    case(
        "logs-runs-file-record-with-unknown-key",
        "logs train-1",
        files={RUNS: '{"run_id": "train-1", "bogus": 1}\n'},
    ),
    case("logs-runs-file-not-utf8", "logs train-1", files={RUNS: b"\xff\xfe{}\n"}),
    case("logs-run-of-a-removed-cluster", "logs train-2", files={RUNS: REST_RUN_OF_A_GONE_CLUSTER}),
    # --- pull, and --pull on run and submit ---------------------------------------------------------
    case("pull-no-run-yet", "pull"),
    case("pull-unknown-run", "pull train-9", files=ENDED_RUN),
    case("pull-to-a-file", f"pull train-1 --to {S}", files=ENDED_RUN),
    case("pull-to-below-a-file", f"pull train-1 --to {S}/results", files=ENDED_RUN),
    case("pull-to-inside-the-run", "pull train-1 --to share/hpcjob/train/logs/train-1/x", files=ENDED_RUN),
    case("pull-to-empty", ["pull", "train-1", "--to", ""], files=ENDED_RUN),
    case("pull-smb-port-zero", "pull train-1 --smb-port 0", files=ENDED_RUN),
    case("run-local-pull-to-a-file", f"run --local --pull-to {S} {S}"),
    case("submit-pull-without-wait", f"submit --pull --node A {S}", config=ONE_CLUSTER),
    case("submit-pull-to-a-file", f"submit --wait --pull-to {S} --node A {S}", config=ONE_CLUSTER),
    # --- retries (issue 33) ----------------------------------------------------------------------------
    case("submit-retries-negative", f"submit --wait --retries -1 --node A {S}", config=ONE_CLUSTER),
    case("submit-retries-huge", f"submit --wait --retries 1000000 --node A {S}", config=ONE_CLUSTER),
    case("submit-retry-on-unknown", f"submit --wait --retry-on sometimes --node A {S}", config=ONE_CLUSTER),
    case(
        "submit-node-wait-bad", f"submit --wait --retries 1 --node-wait soon --node A {S}", config=ONE_CLUSTER
    ),
    case("run-local-retries-huge", f"run --local --retries 1000 {S}"),
    case("run-local-max-cost", f"run --local --max-cost 10 {S}"),
    case("submit-max-cost-negative", f"submit --wait --max-cost -1 --node A {S}", config=ONE_CLUSTER),
    case("submit-max-cost-nan", f"submit --wait --max-cost nan --node A {S}", config=ONE_CLUSTER),
    case("wait-run-of-another-machine", "wait train-9", config=ONE_CLUSTER),
    case("wait-no-run-yet", "wait"),
    case("wait-max-cost-not-a-number", "wait train-1 --max-cost ten", files={RUNS: LOCAL_RUN}),
    case("cluster-add-retries-huge", "cluster add c --url https://head --user alice --retries 101"),
    # --- CPU data nodes (issue 34) ------------------------------------------------------------------
    case("run-local-data-nodes-zero", f"run --local --data-nodes 0 {S}"),
    case("run-local-data-nodes-no-data-service", f"run --local --data-nodes 1 {S}"),
    case("render-data-node-also-a-trainer", f"render --node A --data-node a {S}"),
    case("render-data-nodes-unnamed", f"render --node A --data-nodes 1 {S}"),
    case(
        "submit-data-nodes-elastic",
        f"submit -n 3 --min-nodes 2 --max-restarts 1 --data-nodes 1 {S}",
        config=ONE_CLUSTER,
    ),
    case(
        "submit-data-port-is-rdzv", f"submit --node A --data-node B --data-port 29400 {S}", config=ONE_CLUSTER
    ),
    case("submit-data-wait-bad", f"submit --node A --data-node B --data-wait soon {S}", config=ONE_CLUSTER),
    case(
        "onboard-data-size-alone",
        "cluster onboard c --resource-group rg --location eastus --vm-size "
        "Standard_NC24ads_A100_v4 --nodes 1 --data-vm-size Standard_F16s_v2 --print-only",
    ),
    # --- cluster add ---------------------------------------------------------------------------------
    case("cluster-add-http-url", "cluster add c --url http://head --user alice"),
    case(
        "cluster-add-url-with-password",
        f"cluster add c --url https://alice:{SECRET}@head --user alice",
        secrets=(SECRET,),
    ),
    case(
        "cluster-add-url-with-password-and-bad-port",
        f"cluster add c --url https://alice:{SECRET}@head:99999 --user alice",
        secrets=(SECRET,),
    ),
    case(
        "cluster-add-user-with-password",
        f"cluster add c --url https://h --user alice:{SECRET}",
        secrets=(SECRET,),
    ),
    case("cluster-add-name-with-space", ["cluster", "add", "my lab", "--url", "https://h", "--user", "a"]),
    case("cluster-add-name-like-an-option", "cluster add --url https://h --user a -- -x"),
    case(
        "cluster-add-password-env-empty",
        ["cluster", "add", "c", "--url", "https://h", "--user", "a", "--password-env", ""],
    ),
    case(
        "cluster-add-password-env-is-a-password",
        f"cluster add c --url https://h --user a --password-env {SECRET}!",
        secrets=(SECRET,),
    ),
    case("cluster-add-keyring-without-terminal", "cluster add c --url https://h --user a --keyring"),
    case("cluster-add-ca-bundle-not-pem", f"cluster add c --url https://h --user a --ca-bundle {S}"),
    case("cluster-add-to-a-broken-file", "cluster add c --url https://h --user a", config="[clusters\n"),
    case(
        "cluster-add-region-with-space",
        ["cluster", "add", "c", "--url", "https://h", "--user", "a", "--region", "East US"],
    ),
    case("cluster-add-vm-size-not-a-size", "cluster add c --url https://h --user a --vm-size H100"),
    # --- prices -------------------------------------------------------------------------------------------
    case("prices-size-not-a-size", "prices --size H100 --region eastus"),
    case("prices-size-with-a-quote", ["prices", "--size", "Standard_X' or '1", "--region", "eastus"]),
    case("prices-region-with-space", ["prices", "--size", "Standard_ND96isr_H100_v5", "--region", "East US"]),
    case("prices-without-a-size-or-a-profile", "prices --region eastus"),
    case("prices-profile-without-a-region", "prices --size Standard_ND96isr_H100_v5", config=ONE_CLUSTER),
    case("prices-profile-region-bad", "prices", config=ONE_CLUSTER + 'region = "US East"\n'),
    # --- cluster list / remove --------------------------------------------------------------------------
    case("cluster-list-bad-toml", "cluster list", config="= 1\n"),
    case(
        "cluster-list-url-with-credentials",
        "cluster list",
        config=f"[clusters.lab]\nurl = 'https://alice:{SECRET}@h'\nuser = 'alice'\n",
        secrets=(SECRET,),
    ),
    case("cluster-remove-unknown", "cluster remove nope", config=ONE_CLUSTER),
    case("cluster-remove-without-config", "cluster remove lab"),
    # --- cluster stop / start: only a cluster hpcjob onboarded, refused before az or the head node -----
    case("cluster-stop-not-onboarded", "cluster stop lab", config=ONE_CLUSTER),
    case("cluster-stop-force-not-onboarded", "cluster stop --force", config=ONE_CLUSTER),
    case("cluster-start-not-onboarded", "cluster start lab --print-only", config=ONE_CLUSTER),
    case("cluster-stop-unknown", "cluster stop nope", config=ONE_CLUSTER),
    case("cluster-start-two-names", "cluster start lab dev", config=TWO_CLUSTERS),
    # --- emulator (argparse, not click) -----------------------------------------------------------------
    case("emulator-without-user", "emulator", env=EMULATOR_PASSWORD, secrets=(SECRET,)),
    case("emulator-without-password", "emulator --user alice"),
    case(
        "emulator-password-on-command-line",
        f"emulator --user alice --password {SECRET}",
        env={"HPCJOB_EMULATOR_PASSWORD": "x"},
        secrets=(SECRET,),
    ),
    case(
        "emulator-port-not-a-number",
        "emulator --user alice --port http",
        env=EMULATOR_PASSWORD,
        secrets=(SECRET,),
    ),
    case(
        "emulator-port-70000", "emulator --user alice --port 70000", env=EMULATOR_PASSWORD, secrets=(SECRET,)
    ),
    case(
        "emulator-host-not-an-address",
        "emulator --user alice --host 999.1.1.1",
        env=EMULATOR_PASSWORD,
        secrets=(SECRET,),
    ),
    case(
        "emulator-nodes-file-missing",
        "emulator --user alice --nodes-file nodes.json",
        env=EMULATOR_PASSWORD,
        secrets=(SECRET,),
    ),
    case(
        "emulator-nodes-file-not-json",
        f"emulator --user alice --nodes-file {S}",
        env=EMULATOR_PASSWORD,
        secrets=(SECRET,),
    ),
]


def _limit_memory() -> None:  # in the child, before exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _make_files(root: Path, bad: Case) -> None:
    files: dict[str, str | bytes | Link | None] = {
        "code/train.py": "print('training')\n",
        # Shadows torch for everything the case starts: a node that gets as far as torchrun ends at once.
        "guard/torch/__init__.py": "raise SystemExit('test_bad_input: torch must not be reached')\n",
        **bad.files,
    }
    if bad.config is not None:
        files["clusters.toml"] = bad.config
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            path.mkdir(exist_ok=True)
        elif isinstance(content, Link):
            path.symlink_to(content.target)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def _snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file, folder and link under root, with its bytes: what a case must leave as it was."""
    found: dict[str, bytes | str] = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in dirs + names:
            path = Path(folder, name)
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = f"-> {os.readlink(path)}"
            elif path.is_dir():
                found[key] = "<folder>"
            else:
                found[key] = path.read_bytes()
    return found


def _environment(root: Path, bad: Case) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HPCJOB_", "XDG_")) and k not in ("PYTHONPATH", "COLUMNS")
    }
    env.update(
        {
            "HOME": str(root / "home"),
            "HPCJOB_CONFIG": str(root / "clusters.toml"),
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_STATE_HOME": str(root / "state"),
            "XDG_DATA_HOME": str(root / "data"),
            "HPCJOB_TEST_PASSWORD": PROFILE_PASSWORD,
            "PYTHONPATH": str(root / "guard"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    env.update(bad.env)
    return env


def _run(argv: tuple[str, ...], root: Path, env: dict[str, str]) -> tuple[int, str, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "hpcjob.cli", *argv],
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: whatever it started goes with it
        preexec_fn=_limit_memory,
    )
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(
            f"still running after {TIMEOUT_S} s (killed); stderr so far: "
            f"{err.decode('utf-8', 'backslashreplace')[-300:]!r}"
        )
    return (
        process.returncode,
        out.decode("utf-8", "backslashreplace"),
        err.decode("utf-8", "backslashreplace"),
    )


@pytest.mark.parametrize("bad", CASES)
def test_bad_input_is_refused_in_one_line(bad: Case, tmp_path: Path) -> None:
    _make_files(tmp_path, bad)
    before = _snapshot(tmp_path)
    code, out, err = _run(bad.argv, tmp_path, _environment(tmp_path, bad))
    after = _snapshot(tmp_path)

    problems = []
    if code != bad.code:
        problems.append(f"exit code {code}, expected {bad.code}")
    if "Traceback" in out + err:
        problems.append("a Python traceback")
    if out:
        problems.append(f"stdout is not empty: {out[:120]!r}")
    lines = err.splitlines()  # also splits at U+2028 and the other separators a viewer breaks at
    if bad.warning and len(lines) > 1 and lines[0].startswith(WARNING):
        lines = lines[1:]
    if len(lines) != 1:
        problems.append(f"stderr has {len(lines)} lines, expected one")
    if not lines or not lines[-1].startswith(ERROR) or not lines[-1][len(ERROR) :].strip():
        problems.append(f"stderr does not end in one non-empty {ERROR!r} line")
    if any(_UNCLEAN.search(line) for line in err.rstrip("\n").split("\n")):
        problems.append("stderr holds control characters or line separators")
    for secret in (PROFILE_PASSWORD, *bad.secrets):
        if secret in out + err:
            problems.append(f"a password is printed: {secret!r}")
    created = sorted(set(after) - set(before))
    changed = sorted(k for k in set(after) & set(before) if after[k] != before[k])
    removed = sorted(set(before) - set(after))
    if created or changed or removed:
        problems.append(f"files left behind: created {created[:4]}, changed {changed}, removed {removed}")
    head = " | ".join(err.splitlines()[:2])
    assert not problems, f"{'; '.join(problems)}\n  argv: {list(bad.argv)!r}\n  stderr: {head[:400]}"


def test_the_battery_is_broad() -> None:
    """About a hundred cases over every command, each id unique."""
    ids = [param.id for param in CASES]  # type: ignore[attr-defined]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 100
    commands = {param.values[0].argv[0] for param in CASES if param.values[0].argv}  # type: ignore[attr-defined]
    assert commands >= {
        "render", "run", "submit", "status", "cancel", "nodes", "logs", "pull", "cluster", "emulator"
    }  # fmt: skip
