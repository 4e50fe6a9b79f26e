"""ROS 2 policy controller: observation + goal in, action out at a fixed rate.

    python -m her_mpi_runtime.ros_node --ros-args -p model_path:=policy.onnx

Subscribes to the observation (``std_msgs/Float64MultiArray``) and the goal
(``Float64MultiArray``, or ``geometry_msgs/PointStamped`` / ``PoseStamped`` for 3-D position goals,
chosen by ``goal_type``) and publishes the action (``Float64MultiArray``) every 1/``rate_hz``
seconds (default: the policy's control period). Safety:

* an input older than ``input_timeout_s`` (or never received) makes the node publish
  ``safe_action`` (zeros by default) and warn once until fresh inputs arrive again;
* a message of the wrong length, with NaN/Inf or beyond float32's range is rejected with a
  throttled warning and never reaches the policy;
* continuous actions are clipped to the bounds stored in the policy file; an inference error or a
  non-finite action gives the safe action (counted, logged), never a crash;
* on shutdown (Ctrl-C) the node publishes the safe action once.

With ``trigger: observation`` the node also acts as soon as an observation arrives (lowest
latency, for controllers that send observations at their own rate). Once a second it publishes
``diagnostic_msgs/DiagnosticArray`` on ``/diagnostics`` (see her_mpi_runtime.diagnostics).

This node configures and starts itself; ``her_mpi_runtime.lifecycle_node`` is the managed
(lifecycle) variant with the same parameters and behaviour.
"""

from __future__ import annotations

import sys

# the controller first: it says what to install when ROS 2 is missing
from her_mpi_runtime.controller import (GOAL_TYPES, NODE_NAME, PolicyControllerLogic, parameter_overrides,
                                        refuse_wrong_kinds, run_node)
from rclpy.node import Node  # noqa: I001

__all__ = ["GOAL_TYPES", "PolicyController", "main"]


class PolicyController(PolicyControllerLogic, Node):
    def __init__(self, context=None, **overrides):
        """``overrides`` set parameters directly (tests, embedding); normally they come from
        ``--ros-args`` (``-p name:=value``, ``--params-file``). Bad parameters raise ValueError."""
        Node.__init__(self, NODE_NAME, context=context, parameter_overrides=parameter_overrides(overrides))
        try:
            self.init_controller()
            self.configure_controller()
        except Exception:
            self.destroy_node()
            raise
        self.add_on_set_parameters_callback(refuse_wrong_kinds)
        self.activate_controller()


def main(argv=None) -> int:
    return run_node(PolicyController, argv)


if __name__ == "__main__":
    sys.exit(main())
