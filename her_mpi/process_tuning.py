"""Process-wide settings that make a rank's updates cost their arithmetic: malloc that keeps large
blocks for reuse, and subnormal floats flushed to zero (the trainer sets and restores them)."""

from __future__ import annotations

import ctypes

import numpy as np


def reuse_large_allocations() -> None:
    """Have glibc's malloc keep freed blocks of up to 32 MB for reuse instead of unmapping them.

    A batch of image observations makes tensors of 14-29 MB several times per update, alive
    together and freed together; by default glibc trims a free heap top of more than twice the
    largest such block, so every update faults them in again (four 20 MB tensors: ~20,000 minor
    faults per round, tests/test_speed_paths.py). With the CNN's channels-last copy it took the Ms. Pac-Man DQN learn phase
    (batch 128) from 125-128 to 108-109 ms per update in a quiet epoch (bench/epoch_time.py).
    Small tensors (the MLP recipes) never reach the threshold. No-op where libc is not glibc."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest allowed value
    mallopt(m_trim_threshold, 256 << 20)  # and keep the heap's free top (else it is trimmed away)


def denormals_flushed() -> bool:
    """Whether this thread's floating-point unit flushes subnormal numbers to zero."""
    return float(np.float32(1e-38) / np.float32(1e4)) == 0.0
