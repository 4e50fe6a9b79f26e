"""Fixtures for every test (the shared helpers are in helpers.py)."""

from __future__ import annotations

import signal

import pytest

from helpers import TINY


@pytest.fixture
def tiny_args():
    return list(TINY)


@pytest.fixture(autouse=True)
def ieee_subnormals():
    """Every test starts with IEEE subnormals (hypothesis refuses to run without them), whatever an
    earlier in-process Trainer left behind (it flushes them to zero for speed until it is closed)."""
    import torch

    torch.set_flush_denormal(False)
    yield


def pytest_configure(config):
    """A suite stopped with SIGTERM (a CI timeout, ``kill PID``) unwinds like one stopped with Ctrl-C,
    so fixtures and ``with`` blocks clean up: the simulated hosts' daemons and network namespaces
    would otherwise outlive it."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
