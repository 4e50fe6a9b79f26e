"""Controller statistics and their ``diagnostic_msgs/DiagnosticArray`` form.

``ControlStats`` is plain Python + numpy (no ROS): the controller nodes record every tick,
inference and rejected message into it, and once a second turn a window of it into one
``DiagnosticStatus``. Its memory is fixed: counters and a ring of the last latencies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

LATENCY_SAMPLES = 1000  # p50/p99 over the last this many inferences (40 s at 25 Hz)
RATE_TOLERANCE = 0.1  # an achieved rate more than 10% off the nominal one is a warning


@dataclass
class Window:
    """What happened since the previous diagnostics message."""

    seconds: float
    published: int
    stale: int
    rejected: int
    errors: int

    @property
    def rate_hz(self) -> float:
        return self.published / self.seconds if self.seconds > 0 else 0.0


class ControlStats:
    """Counts since the policy was configured, plus the current diagnostics window."""

    def __init__(self):
        self.published = 0  # actions published, safe ones included
        self.safe = 0  # safe actions published (stale inputs, deactivation, inference errors)
        self.stale = 0  # ticks whose observation or goal was missing or older than the timeout
        self.accepted = 0  # input messages (observations and goals) that reached the controller
        self.rejected = 0  # input messages refused (wrong length, NaN/Inf, beyond float32)
        self.errors = 0  # inferences that raised or gave a non-finite / out-of-range action
        self.inferences = 0
        self._latency_s = np.zeros(LATENCY_SAMPLES)
        self._window_start = time.monotonic()
        self._window_counts = (0, 0, 0, 0)

    def record_latency(self, seconds: float) -> None:
        self._latency_s[self.inferences % LATENCY_SAMPLES] = seconds
        self.inferences += 1

    def latency_percentiles_us(self) -> tuple[float, float]:
        """(p50, p99) in microseconds over the recent inferences; NaN before the first one."""
        if self.inferences == 0:
            return float("nan"), float("nan")
        recent = self._latency_s[:min(self.inferences, LATENCY_SAMPLES)]
        p50, p99 = np.percentile(recent, [50, 99]) * 1e6
        return float(p50), float(p99)

    def restart_window(self) -> None:
        """Start measuring the achieved rate from now (control just started)."""
        self._window_start = time.monotonic()
        self._window_counts = (self.published, self.stale, self.rejected, self.errors)

    def close_window(self) -> Window:
        now = time.monotonic()
        published, stale, rejected, errors = self._window_counts
        window = Window(now - self._window_start, self.published - published, self.stale - stale,
                        self.rejected - rejected, self.errors - errors)
        self._window_start = now
        self._window_counts = (self.published, self.stale, self.rejected, self.errors)
        return window


def diagnostic_array(stamp, name: str, state: str, nominal_rate_hz: float, stats: ControlStats,
                     window: Window, identity: dict | None) -> DiagnosticArray:
    """One status named ``name`` for a controller in lifecycle ``state`` (unconfigured, inactive,
    active); ``identity`` is ``Policy.identity`` or None when no policy is loaded."""
    p50, p99 = stats.latency_percentiles_us()
    problems = []
    level = DiagnosticStatus.OK
    if state == "active":
        if window.errors:
            level = DiagnosticStatus.ERROR
            problems.append(f"{window.errors} inference error(s), safe action published")
        if window.stale:
            problems.append(f"inputs stale or missing at {window.stale} tick(s), safe action published")
        if window.rejected:
            problems.append(f"{window.rejected} input message(s) rejected")
        if nominal_rate_hz > 0 and abs(window.rate_hz - nominal_rate_hz) > RATE_TOLERANCE * nominal_rate_hz:
            problems.append(f"control rate {window.rate_hz:.1f} Hz, nominal {nominal_rate_hz:g} Hz")
        if problems and level == DiagnosticStatus.OK:
            level = DiagnosticStatus.WARN
        message = "; ".join(problems) or "running"
    else:
        message = "inactive: policy loaded, not publishing" if state == "inactive" else "unconfigured: no policy loaded"
    identity = identity or {}
    values = {
        "state": state,
        "rate_hz_nominal": f"{nominal_rate_hz:g}",
        "rate_hz_achieved": f"{window.rate_hz:.3f}" if state == "active" else "0",
        "inference_latency_p50_us": f"{p50:.1f}",
        "inference_latency_p99_us": f"{p99:.1f}",
        "inferences": str(stats.inferences),
        "actions_published": str(stats.published),
        "safe_actions_published": str(stats.safe),
        "stale_inputs": str(stats.stale),
        "accepted_inputs": str(stats.accepted),
        "rejected_inputs": str(stats.rejected),
        "inference_errors": str(stats.errors),
        "policy_sha256": identity.get("sha256", ""),
        "policy_env_id": identity.get("env_id", ""),
        "policy_algo": identity.get("algo", ""),
        "policy_train_env_steps": str(identity.get("train_env_steps", "")),
        "policy_path": identity.get("path", ""),
    }
    status = DiagnosticStatus(level=level, name=name, message=message,
                              values=[KeyValue(key=k, value=v) for k, v in values.items()])
    array = DiagnosticArray(status=[status])
    array.header.stamp = stamp
    return array
