"""Fixtures for every test (the shared helpers are in helpers.py)."""

from __future__ import annotations

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
