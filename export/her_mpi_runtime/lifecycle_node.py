"""The managed (lifecycle) ROS 2 policy controller, as ros2_control's controllers are run.

    python -m her_mpi_runtime.lifecycle_node --ros-args -p model_path:=policy.onnx [-p autostart:=true]

Same parameters, topics, safety checks and diagnostics as ``her_mpi_runtime.ros_node``; the node
starts unconfigured and moves through the standard lifecycle transitions (``ros2 lifecycle set
/her_policy_controller configure``, or any client of its ``~/change_state`` service):

* configure: read the parameters, load and validate the policy, subscribe, advertise the action;
  a bad parameter or policy file fails the transition (logged) and the node stays unconfigured;
* activate: start publishing actions at ``rate_hz``;
* deactivate: publish the safe action once and stop;
* cleanup: unsubscribe and release the model (back to unconfigured, parameters may change);
* shutdown: the safe action once if it was active, then release.

Diagnostics are published once a second in every state. ``autostart: true`` configures and
activates the node at start (for setups without a lifecycle manager).
"""

from __future__ import annotations

import sys

# the controller first: it says what to install when ROS 2 is missing
from her_mpi_runtime.controller import (NODE_NAME, PolicyControllerLogic, checked, declare_untyped,
                                        parameter_overrides, refuse_wrong_kinds, run_node)
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn  # noqa: I001
from std_msgs.msg import Float64MultiArray

__all__ = ["ManagedPolicyController", "main"]


class ManagedPolicyController(PolicyControllerLogic, LifecycleNode):
    def __init__(self, context=None, **overrides):
        """``overrides`` set parameters directly (tests, embedding), as for ros_node.PolicyController."""
        LifecycleNode.__init__(self, NODE_NAME, context=context, parameter_overrides=parameter_overrides(overrides))
        try:
            self.init_controller()
            self.autostart = checked("autostart", declare_untyped(self, "autostart", False).value)
        except Exception:
            self.destroy_node()
            raise
        self.add_on_set_parameters_callback(refuse_wrong_kinds)  # after the declarations: they are checked above
        self.configure_error = ""

    def make_action_publisher(self, topic: str, qos):
        return self.create_lifecycle_publisher(Float64MultiArray, topic, qos)

    def destroy_action_publisher(self, publisher) -> None:
        self.destroy_lifecycle_publisher(publisher)

    # rclpy turns an exception in a transition callback into ERROR without a word, so every
    # callback reports its own failure.

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            self.configure_controller()
        except (ValueError, OSError) as exc:
            self.configure_error = str(exc)
            self.get_logger().error(f"configure failed: {exc}")
            return TransitionCallbackReturn.FAILURE
        return super().on_configure(state)

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        result = super().on_activate(state)  # enables the action publisher
        if result == TransitionCallbackReturn.SUCCESS:
            self.activate_controller()
        return result

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.deactivate_controller()  # the safe action goes out before the publisher is disabled
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.release_controller()
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        if self.controller_state == "active":
            self.deactivate_controller()
        self.release_controller()
        return super().on_shutdown(state)

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.get_logger().error(f"transition from {state.label} failed; releasing the policy")
        self.release_controller()
        return TransitionCallbackReturn.SUCCESS  # back to unconfigured


def start(node: ManagedPolicyController) -> None:
    """With ``autostart``, configure and activate at once; a failure is the process's error."""
    if not node.autostart:
        node.get_logger().info("unconfigured; waiting for the configure transition (or set autostart: true)")
        return
    if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
        raise ValueError(f"autostart: configure failed: {node.configure_error}")
    if node.trigger_activate() != TransitionCallbackReturn.SUCCESS:
        raise ValueError("autostart: activate failed (see the log)")


def main(argv=None) -> int:
    return run_node(ManagedPolicyController, argv, start=start)


if __name__ == "__main__":
    sys.exit(main())
