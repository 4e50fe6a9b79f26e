"""Sum tree (with a parallel min tree) for prioritized sampling: O(log n) batched update and sample."""

from __future__ import annotations

import numpy as np


class SumTree:
    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.leaf_offset = 1 << max(0, (self.capacity - 1).bit_length())
        self.depth = self.leaf_offset.bit_length() - 1
        self.sums = np.zeros(2 * self.leaf_offset, dtype=np.float64)
        self.mins = np.full(2 * self.leaf_offset, np.inf, dtype=np.float64)  # zero leaves excluded

    def update(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set leaf priorities; with repeated indices the last value wins."""
        indices = np.asarray(indices, dtype=np.int64).ravel()
        priorities = np.asarray(priorities, dtype=np.float64).ravel()
        if indices.size == 0:
            return
        if np.any(indices < 0) or np.any(indices >= self.capacity):
            raise IndexError(f"sum tree index out of range [0, {self.capacity})")
        if np.any(priorities < 0) or not np.all(np.isfinite(priorities)):
            raise ValueError("priorities must be finite and >= 0")
        nodes = indices + self.leaf_offset
        self.sums[nodes] = priorities
        self.mins[nodes] = np.where(priorities > 0, priorities, np.inf)
        nodes = np.unique(nodes >> 1)
        while nodes.size and nodes[-1] >= 1:
            # Recompute parents from children rather than adding deltas: no drift, duplicates safe.
            self.sums[nodes] = self.sums[2 * nodes] + self.sums[2 * nodes + 1]
            self.mins[nodes] = np.minimum(self.mins[2 * nodes], self.mins[2 * nodes + 1])
            if nodes[0] == 1:
                break
            nodes = np.unique(nodes >> 1)

    def get(self, indices: np.ndarray) -> np.ndarray:
        return self.sums[np.asarray(indices, dtype=np.int64) + self.leaf_offset]

    @property
    def total(self) -> float:
        return float(self.sums[1])

    @property
    def min(self) -> float:
        """Smallest non-zero priority (inf when every leaf is zero)."""
        return float(self.mins[1])

    def find(self, mass: np.ndarray) -> np.ndarray:
        """Leaf indices whose cumulative priority interval contains each ``mass`` in [0, total)."""
        mass = np.array(mass, dtype=np.float64)
        nodes = np.ones(mass.shape, dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * nodes
            go_right = mass >= self.sums[left]
            mass -= np.where(go_right, self.sums[left], 0.0)
            nodes = left + go_right
        return nodes - self.leaf_offset

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Stratified sampling: one draw from each of n equal slices of the total mass."""
        total = self.total
        if total <= 0:
            raise ValueError("cannot sample from a sum tree whose priorities are all zero")
        mass = (np.arange(n) + rng.random(n)) * (total / n)
        indices = self.find(np.minimum(mass, np.nextafter(total, 0)))
        # Rounding can land on a zero leaf at a slice boundary; redraw those few uniformly.
        bad = self.get(indices) <= 0
        while bad.any():
            indices[bad] = self.find(rng.random(int(bad.sum())) * total)
            bad = self.get(indices) <= 0
        return indices
