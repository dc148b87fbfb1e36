"""pytest fixtures for the test bed; use them with `pytest_plugins = ["tests.testbed.fixtures"]`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .bed import TestBed
from .prerequisites import require_testbed


@pytest.fixture(scope="module")
def testbed() -> Iterator[TestBed]:
    """node1/NODE1 and node2/NODE2 with /app, and HEADNODE's SMB server: shared by a module's tests."""
    require_testbed()
    with TestBed() as bed:
        yield bed


@pytest.fixture
def testbed_factory() -> Iterator[Callable[..., TestBed]]:
    """Start beds of your own inside a test (TestBed's arguments); all are torn down after it."""
    require_testbed()
    with contextlib.ExitStack() as stack:

        def start(*args: Any, **kwargs: Any) -> TestBed:
            return stack.enter_context(TestBed(*args, **kwargs))

        yield start
