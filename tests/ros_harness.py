"""A policy controller node plus a test node that feeds it and listens to it, with real rclpy.

Each harness has its own rclpy context on a random DDS domain (helpers.ros_domain_id), so tests
(the other pytest worker's, and other test sessions on the machine) do not hear each other.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PointStamped
from rclpy.executors import SingleThreadedExecutor
from std_msgs.msg import Float64MultiArray

from helpers import ros_domain_id


def new_context() -> rclpy.Context:
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=ros_domain_id())
    return context


def diagnostic_values(array: DiagnosticArray) -> dict:
    (status,) = array.status
    return {"level": status.level, "name": status.name, "message": status.message,
            **{kv.key: kv.value for kv in status.values}}


def problems_besides_rate(message: str) -> list[str]:
    """The problems a diagnostics message names, less a control-rate warning (a loaded machine
    may lose a tick or five in a second; the rate itself is tested over longer windows)."""
    return [p for p in message.split("; ") if p not in ("running", "") and not p.startswith("control rate")]


class Harness:
    def __init__(self, node_class, policy_file, goal_type="array", rate_hz=50.0, keep_actions=1000,
                 keep_diagnostics=50, **params):
        self.context = new_context()
        try:
            self.node = node_class(context=self.context, model_path=str(policy_file), goal_type=goal_type,
                                   rate_hz=rate_hz, **params)
        except Exception:
            rclpy.shutdown(context=self.context)
            raise
        self.tester = rclpy.create_node("tester", context=self.context)
        self.actions = deque(maxlen=keep_actions)  # bounded: long bursts must not grow the test itself
        self.action_count = 0
        self.diagnostics = deque(maxlen=keep_diagnostics)
        self.tester.create_subscription(Float64MultiArray, "action", self._on_action, 10)
        self.tester.create_subscription(DiagnosticArray, "/diagnostics",
                                        lambda m: self.diagnostics.append((time.monotonic(), m)), 10)
        self.observation = self.tester.create_publisher(Float64MultiArray, "observation", 10)
        goal_msg = PointStamped if goal_type == "point" else Float64MultiArray
        self.goal = self.tester.create_publisher(goal_msg, "desired_goal", 10)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.tester)

    def _on_action(self, msg):
        self.actions.append(np.array(msg.data))
        self.action_count += 1

    def spin(self, seconds, publish=None):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if publish:
                publish()
            self.executor.spin_once(timeout_sec=0.005)

    def spin_until(self, predicate, timeout=5.0, publish=None) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            if publish:
                publish()
            self.executor.spin_once(timeout_sec=0.005)
        return predicate()

    def next_diagnostics(self, timeout=3.0, publish=None) -> dict:
        """The values of the next diagnostics message to arrive (spinning, and publishing with
        ``publish()`` if given, meanwhile)."""
        seen = len(self.diagnostics) and self.diagnostics[-1][0]
        assert self.spin_until(lambda: self.diagnostics and self.diagnostics[-1][0] != seen, timeout, publish), \
            "no diagnostics message"
        return diagnostic_values(self.diagnostics[-1][1])

    def send(self, obs, goal):
        self.observation.publish(Float64MultiArray(data=[float(v) for v in obs]))
        if isinstance(goal, PointStamped):
            self.goal.publish(goal)
        else:
            self.goal.publish(Float64MultiArray(data=[float(v) for v in goal]))

    def close(self):
        self.executor.shutdown()
        self.node.destroy_node()
        self.tester.destroy_node()
        rclpy.shutdown(context=self.context)
