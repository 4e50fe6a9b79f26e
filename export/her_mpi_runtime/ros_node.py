"""ROS 2 policy controller: observation + goal in, action out at a fixed rate.

    ros2 run ... / python -m her_mpi_runtime.ros_node --ros-args -p model_path:=policy.onnx

Subscribes to the observation (``std_msgs/Float64MultiArray``) and the goal
(``Float64MultiArray``, or ``geometry_msgs/PointStamped`` / ``PoseStamped`` for 3-D position goals,
chosen by ``goal_type``) and publishes the action (``Float64MultiArray``) every 1/``rate_hz``
seconds (default: the policy's control period). Safety:

* an input older than ``input_timeout_s`` (or never received) makes the node publish
  ``safe_action`` (zeros by default) and warn once until fresh inputs arrive again;
* a message of the wrong length or with NaN/Inf is rejected with a throttled warning and never
  reaches the policy;
* continuous actions are clipped to the bounds stored in the policy file.

With ``trigger: observation`` the node also acts as soon as an observation arrives (lowest
latency, for controllers that send observations at their own rate).
"""

from __future__ import annotations

import sys

import numpy as np
import rclpy
import rclpy.executors
import rclpy.parameter
from geometry_msgs.msg import PointStamped, PoseStamped
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import Float64MultiArray

from her_mpi_runtime.policy import Policy

GOAL_TYPES = {"array": Float64MultiArray, "point": PointStamped, "pose": PoseStamped}
WARN_THROTTLE_S = 2.0


class PolicyController(Node):
    def __init__(self, context=None, **overrides):
        """``overrides`` set parameters directly (tests, embedding); normally they come from
        ``--ros-args`` (``-p name:=value``, ``--params-file``)."""
        super().__init__("her_policy_controller", context=context,
                         parameter_overrides=[rclpy.parameter.Parameter(k, value=v) for k, v in overrides.items()])
        declare = self.declare_parameter
        model_path = declare("model_path", "").value
        if not model_path:
            raise ValueError("parameter model_path is required (the .onnx file from python -m her_mpi.export)")
        self.policy = Policy(model_path, intra_op_threads=declare("intra_op_threads", 1).value)
        meta = self.policy.metadata
        rate_hz = float(declare("rate_hz", 0.0).value) or meta.rate_hz
        if rate_hz <= 0:
            raise ValueError(f"rate_hz must be > 0 (the policy {model_path} stores no control period)")
        self.input_timeout_s = float(declare("input_timeout_s", 0.5).value)
        goal_type = declare("goal_type", "array").value
        if goal_type not in GOAL_TYPES:
            raise ValueError(f"goal_type must be one of {', '.join(GOAL_TYPES)}, got {goal_type!r}")
        if goal_type != "array" and meta.goal_dim != 3:
            raise ValueError(f"goal_type {goal_type!r} carries a 3-D position, but the policy's goal "
                             f"has {meta.goal_dim} dimensions; use goal_type 'array'")
        safe = np.asarray(declare("safe_action", [0.0] * max(1, meta.action_dim)).value, np.float64)
        if safe.shape != (meta.action_dim,) or not np.all(np.isfinite(safe)):
            raise ValueError(f"safe_action must hold {meta.action_dim} finite numbers, got {safe.tolist()}")
        self.safe_action = safe
        self.trigger = declare("trigger", "timer").value

        self.observation = self.goal = None
        self.observation_time = self.goal_time = None
        self.stale_warned = False
        self.counts = {"published": 0, "safe": 0, "rejected": 0}
        self.last_action = None

        qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)
        self.publisher = self.create_publisher(Float64MultiArray, declare("action_topic", "action").value, qos)
        self.create_subscription(Float64MultiArray, declare("observation_topic", "observation").value,
                                 self.on_observation, qos)
        self.create_subscription(GOAL_TYPES[goal_type], declare("goal_topic", "desired_goal").value,
                                 self.on_goal, qos)
        self.timer = self.create_timer(1.0 / rate_hz, self.on_timer)
        self.get_logger().info(
            f"{meta.algo} policy for {meta.env_id} from {model_path}: obs {meta.obs_dim}, goal {meta.goal_dim} "
            f"({goal_type}), action {meta.action_dim}, {rate_hz:g} Hz, timeout {self.input_timeout_s:g}s")

    # -- inputs --------------------------------------------------------------------------------

    def on_observation(self, msg: Float64MultiArray) -> None:
        values = self.accepted("observation", msg.data, self.policy.metadata.obs_dim)
        if values is not None:
            self.observation, self.observation_time = values, self.get_clock().now()
            if self.trigger == "observation":
                self.on_timer()

    def on_goal(self, msg) -> None:
        if isinstance(msg, Float64MultiArray):
            data = msg.data
        else:
            point = msg.point if isinstance(msg, PointStamped) else msg.pose.position
            data = (point.x, point.y, point.z)
        values = self.accepted("goal", data, self.policy.metadata.goal_dim)
        if values is not None:
            self.goal, self.goal_time = values, self.get_clock().now()

    def accepted(self, name: str, data, expected: int) -> np.ndarray | None:
        values = np.asarray(data, dtype=np.float64)
        problem = None
        if values.shape != (expected,):
            problem = f"has {values.size} values, expected {expected}"
        elif not np.all(np.isfinite(values)):
            problem = "contains NaN or Inf"
        if problem is None:
            return values
        self.counts["rejected"] += 1
        self.get_logger().warning(f"rejected {name} message: it {problem}", throttle_duration_sec=WARN_THROTTLE_S)
        return None

    # -- output --------------------------------------------------------------------------------

    def fresh(self) -> bool:
        if self.observation is None or self.goal is None:
            return False
        now = self.get_clock().now()
        oldest = min(self.observation_time, self.goal_time)
        return (now - oldest).nanoseconds * 1e-9 <= self.input_timeout_s

    def on_timer(self) -> None:
        if self.fresh():
            self.stale_warned = False
            action = np.asarray(self.policy.act(self.observation, self.goal), np.float64).reshape(-1)
            meta = self.policy.metadata
            if not meta.discrete:
                action = np.clip(action, meta.action_low, meta.action_high)
        else:
            if not self.stale_warned:
                self.get_logger().warning(f"no observation and goal newer than {self.input_timeout_s:g}s: "
                                       f"publishing the safe action {self.safe_action.tolist()}")
                self.stale_warned = True
            action = self.safe_action
            self.counts["safe"] += 1
        self.publisher.publish(Float64MultiArray(data=action.tolist()))
        self.counts["published"] += 1
        self.last_action = action


def main(argv=None) -> int:
    rclpy.init(args=argv if argv is not None else sys.argv)
    try:
        node = PolicyController()
    except (ValueError, FileNotFoundError) as exc:
        print(f"her_policy_controller: error: {exc}", file=sys.stderr)
        rclpy.shutdown()
        return 2
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, rclpy.executors.ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
