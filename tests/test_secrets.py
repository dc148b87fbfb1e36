"""Secrets reach the job without being written where others read (issue 38 item 3).

Every cluster user can read a job's environment, and the run history keeps the command: a value that
looks like a secret is refused in `--env` and in requirements lines, pointing to `--secret`, and names
that hold a secret's usual words are refused too. Each refusal names what it matched, never the value.
"""

from __future__ import annotations

import pytest

from hpcjob.job.spec import JobSpec, SpecError, check_requirements

# Values and names made up for these tests: none is anyone's.
SECRET_VALUES = [
    ("postgres://app:pw4321@db.contoso.com/x", "a URL with a user and password (postgres://USER:PASSWORD@)"),
    ("redis://:pw4321@cache:6379/0", "a URL with a user and password (redis://USER:PASSWORD@)"),
    ("mongodb+srv://app:pw4321@cluster0.example.net/db", "(mongodb+srv://USER:PASSWORD@)"),
    ("amqp://guest:pw4321@rabbit:5672/", "(amqp://USER:PASSWORD@)"),
    ("s3://AKIAEXAMPLE:pw4321@bucket/key", "(s3://USER:PASSWORD@)"),
    ("ftp://me:pw4321@files.example.com/", "(ftp://USER:PASSWORD@)"),
    ("https://me:pw4321@example.com/", "a URL with a user or token"),
    ("https://graph.example.com/v1?access_token=abc123", "the query parameter access_token="),
    ("https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&sig=abc%2Bdef", "the query parameter sig="),
    ("https://example.com/hook?Signature=abc", "the query parameter signature="),
    ("https://example.com/x?a=1&token=abc", "the query parameter token="),
    ("https://example.com/login;password=abc", "the query parameter password="),
    (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=bm90YXJlYWxrZXk=;EndpointSuffix=core",
        "AccountKey=",
    ),
    ("BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature=sv=2022&sig=abc", "Shared"),
]


def spec(**fields: object) -> JobSpec:
    return JobSpec(script="train.py", **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "matched"), SECRET_VALUES)
def test_a_secret_looking_env_value_is_refused_naming_what_it_matched_and_never_the_value(
    value: str, matched: str
) -> None:
    with pytest.raises(SpecError) as info:
        spec(env=(("SOME_SETTING", value),))
    said = str(info.value)
    assert matched in said and "--secret SOME_SETTING" in said and "\n" not in said
    assert "pw4321" not in said and "abc" not in said and "bm90" not in said


@pytest.mark.parametrize(("value", "matched"), SECRET_VALUES)
def test_a_secret_looking_requirements_line_is_refused_pointing_to_secret(value: str, matched: str) -> None:
    with pytest.raises(SpecError) as info:
        check_requirements(f"torch\n--extra-index-url {value}\n")
    said = str(info.value)
    assert said.startswith("requirements line 2:") and matched in said and "--secret" in said
    assert "pw4321" not in said and "abc" not in said


@pytest.mark.parametrize(
    ("name", "matched"),
    [
        ("AZURE_STORAGE_CONNECTION_STRING", "CONNECTION_STRING"),
        ("DATABASE_URL", "DATABASE_URL"),
        ("SAS", "SAS"),
        ("BLOB_SAS", "SAS"),
        ("SAS_URL", "SAS"),
        ("MY_SAS_URI", "SAS"),
        ("SMTP_PASS", "PASS"),
        ("DB_PASSWORD", "PASSWORD"),
        ("HF_TOKEN", "TOKEN"),
    ],
)
def test_a_secret_looking_env_name_is_refused_naming_the_word_it_holds(name: str, matched: str) -> None:
    with pytest.raises(SpecError) as info:
        spec(env=((name, "x"),))
    said = str(info.value)
    assert f"holds {matched}" in said and "looks like a secret" in said and f"--secret {name}" in said


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATA_URL", "https://example.com/data?key=train/x.bin"),
        ("SASL_MECHANISM", "SCRAM-SHA-256"),
        ("KAFKA_SASL", "plain"),
        ("PASSAGE_DIR", "/data/passages"),
        ("COMPASS", "north"),
        ("BYPASS_CACHE", "1"),
        ("CONNECTION_TIMEOUT", "30"),
        ("DATABASE_NAME", "runs"),
        ("REPO", "ssh://git@github.com/a/b.git"),
        ("MIRROR", "https://pypi.example.com/simple"),
        ("EMAIL", "me@example.com"),
        ("WANDB_PROJECT", "a@b"),
        ("QUERY", "https://example.com/x?tokens=512&signatures=off&design=1"),
        ("STORAGE", "AccountName=acct;EndpointSuffix=core.windows.net"),
        ("NOTE", "postgres://db.example.com/x"),
        ("PROXY", "http://proxy.example.com:3128"),
    ],
)
def test_harmless_values_and_names_still_pass(name: str, value: str) -> None:
    assert spec(env=((name, value),)).env == ((name, value),)
    check_requirements(f"torch\n# {value}\nhttps://example.com/pkg.whl?key=train/x.bin\n")
