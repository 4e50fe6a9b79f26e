"""What both ROS 2 policy controllers do, written once: parameters, input checks, the control
tick, the safe action and diagnostics.

``PolicyControllerLogic`` is mixed into an rclpy ``Node`` (``ros_node.PolicyController``, which
configures and starts itself) or ``LifecycleNode`` (``lifecycle_node.ManagedPolicyController``,
driven by configure / activate / deactivate / cleanup). The node's life has three states:

* unconfigured: parameters declared, diagnostics published, no policy;
* inactive: policy loaded and validated, topics subscribed, no actions published;
* active: an action on every tick of the ``rate_hz`` timer (and, with ``trigger: observation``,
  on every accepted observation).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from her_mpi_runtime.policy import FLOAT32_MAX, Policy

try:
    import rclpy
    import rclpy.executors
    import rclpy.parameter
    from rclpy.exceptions import InvalidTopicNameException
    from rclpy.validate_topic_name import validate_topic_name
    from diagnostic_msgs.msg import DiagnosticArray
    from geometry_msgs.msg import PointStamped, PoseStamped
    from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from std_msgs.msg import Float64MultiArray

    from her_mpi_runtime.diagnostics import ControlStats, diagnostic_array
except ImportError as exc:
    raise ImportError(f"the ROS 2 policy controller needs rclpy and the std/geometry/diagnostic/lifecycle "
                      f"messages, but {(exc.name or str(exc)).split('.')[0]} is missing: pip install \"her_mpi_runtime[ros]\" (or "
                      f"\"her_mpi[ros]\"), or source your ROS 2 installation") from exc

NODE_NAME = "her_policy_controller"
GOAL_TYPES = {"array": Float64MultiArray, "point": PointStamped, "pose": PoseStamped}
TRIGGERS = ("timer", "observation")
WARN_THROTTLE_S = 2.0
DIAGNOSTICS_PERIOD_S = 1.0
# Parameters and defaults (launch/policy_controller.yaml lists the same).
PARAMETERS = {
    "model_path": "",
    "intra_op_threads": 1,
    "rate_hz": 0.0,
    "input_timeout_s": 0.5,
    "trigger": "timer",
    "goal_type": "array",
    "observation_topic": "observation",
    "goal_topic": "desired_goal",
    "action_topic": "action",
    "diagnostics_topic": "/diagnostics",
}


def parameter_overrides(overrides: dict) -> list:
    return [rclpy.parameter.Parameter(name, value=value) for name, value in overrides.items()]


# What each parameter must hold. They are declared without a fixed type, so that ``rate_hz:=25`` (an
# integer to rclpy) is a rate like 25.0 and a wrong type is reported with the parameter's name (rclpy's
# own refusal is a traceback); ``checked`` enforces these, at configure and on every later set.
KINDS = {
    "model_path": ((str,), "a path to an .onnx file"),
    "intra_op_threads": ((int,), "an integer >= 0"),
    "rate_hz": ((int, float), "a number of Hz (0: the policy's own)"),
    "input_timeout_s": ((int, float), "a number of seconds"),
    "trigger": ((str,), f"one of {', '.join(TRIGGERS)}"),
    "goal_type": ((str,), f"one of {', '.join(GOAL_TYPES)}"),
    **{name: ((str,), "a topic name") for name in PARAMETERS if name.endswith("_topic")},
    "autostart": ((bool,), "true or false"),
}


def declare_untyped(node, name: str, default):
    return node.declare_parameter(name, default, ParameterDescriptor(dynamic_typing=True))


def checked(name: str, value):
    """``value`` of parameter ``name`` when it is of its kind (KINDS; a bool is no number), else ValueError.
    Topic names are also validated as rclpy would."""
    kinds, expected = KINDS[name]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ValueError(f"parameter {name} must be {expected}, got {value!r}")
    if name.endswith("_topic"):
        try:
            validate_topic_name(value)
        except InvalidTopicNameException as exc:
            raise ValueError(f"parameter {name}: {str(exc).splitlines()[0]} {value!r}") from None
    return value


def refuse_wrong_kinds(parameters) -> SetParametersResult:
    """An on-set-parameters callback: a later ``ros2 param set`` of a wrong kind is refused, naming it."""
    for parameter in parameters:
        if parameter.name in KINDS:
            try:
                checked(parameter.name, parameter.value)
            except ValueError as exc:
                return SetParametersResult(successful=False, reason=str(exc))
    return SetParametersResult(successful=True)


class PolicyControllerLogic:
    """The controller's behaviour; the class it is mixed into must derive from rclpy's Node."""

    def init_controller(self) -> None:
        for name, default in PARAMETERS.items():
            declare_untyped(self, name, default)
        declare_untyped(self, "safe_action", [])  # empty: zeros of the policy's action size
        self.policy: Policy | None = None
        self.stats = ControlStats()
        self.controller_state = "unconfigured"
        self.rate_hz = 0.0
        self.observation = self.goal = None
        self.observation_time = self.goal_time = None
        self._stale_warned = False
        self._input_subscriptions: list = []  # made by configure_controller
        self._action_publisher = None
        self._control_timer = None
        self._diagnostics_publisher = self.create_publisher(
            DiagnosticArray, checked("diagnostics_topic", self.get_parameter("diagnostics_topic").value), 10)
        self.create_timer(DIAGNOSTICS_PERIOD_S, self.publish_diagnostics)

    # -- configure / activate / deactivate / release -------------------------------------------

    def configure_controller(self) -> None:
        """Load and validate the policy and the parameters, then subscribe and advertise. Raises
        ValueError / OSError naming the bad value; nothing is created when it raises."""
        param = lambda name: self.get_parameter(name).value  # noqa: E731
        model_path = checked("model_path", param("model_path"))
        if not model_path:
            raise ValueError("parameter model_path is required (the .onnx file from python -m her_mpi.export)")
        threads = checked("intra_op_threads", param("intra_op_threads"))
        if threads < 0:
            raise ValueError(f"intra_op_threads must be >= 0 (0: onnxruntime's default), got {threads}")
        trigger, goal_type = checked("trigger", param("trigger")), checked("goal_type", param("goal_type"))
        if trigger not in TRIGGERS:
            raise ValueError(f"trigger must be one of {', '.join(TRIGGERS)}, got {trigger!r}")
        if goal_type not in GOAL_TYPES:
            raise ValueError(f"goal_type must be one of {', '.join(GOAL_TYPES)}, got {goal_type!r}")
        topics = {name: checked(name, param(name)) for name in ("action_topic", "observation_topic", "goal_topic")}
        timeout = float(checked("input_timeout_s", param("input_timeout_s")))
        if not timeout > 0:
            raise ValueError(f"input_timeout_s must be > 0 seconds, got {timeout}")
        policy = Policy(model_path, intra_op_threads=threads)
        meta = policy.metadata
        rate_hz = float(checked("rate_hz", param("rate_hz"))) or meta.rate_hz
        if not (rate_hz > 0 and np.isfinite(rate_hz)):
            raise ValueError(f"rate_hz must be > 0, got {param('rate_hz')} "
                             f"(and the policy {model_path} stores no control period)")
        if goal_type != "array" and meta.goal_dim != 3:
            raise ValueError(f"goal_type {goal_type!r} carries a 3-D position, but the policy's goal "
                             f"has {meta.goal_dim} dimensions; use goal_type 'array'")
        safe_action = self._validated_safe_action(param("safe_action"), meta)

        self.policy, self.rate_hz, self.input_timeout_s = policy, rate_hz, timeout
        self.trigger, self.goal_type, self.safe_action = trigger, goal_type, safe_action
        self.stats = ControlStats()
        self.observation = self.goal = self.observation_time = self.goal_time = None
        qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)
        self._action_publisher = self.make_action_publisher(topics["action_topic"], qos)
        self._input_subscriptions = [
            self.create_subscription(Float64MultiArray, topics["observation_topic"], self.on_observation, qos),
            self.create_subscription(GOAL_TYPES[goal_type], topics["goal_topic"], self.on_goal, qos)]
        self.controller_state = "inactive"
        self.get_logger().info(
            f"{meta.algo} policy for {meta.env_id} from {model_path} (sha256 {policy.sha256[:12]}): "
            f"obs {meta.obs_dim}, goal {meta.goal_dim} ({goal_type}), action {meta.action_dim}, "
            f"{rate_hz:g} Hz, timeout {timeout:g}s, safe action {safe_action.tolist()}")

    @staticmethod
    def _validated_safe_action(value, meta) -> np.ndarray:
        expected = f"safe_action must be a list of {meta.action_dim} finite numbers"
        if isinstance(value, (str, bytes, bool, int, float)) or value is None:
            raise ValueError(f"{expected}, got {value!r}")
        value = list(value)
        if any(isinstance(v, (bool, str, bytes)) for v in value):
            raise ValueError(f"{expected}, got {value}")
        safe = np.zeros(meta.action_dim) if not value else np.asarray(value, np.float64)
        if safe.shape != (meta.action_dim,) or not np.all(np.isfinite(safe)):
            raise ValueError(f"{expected} (the policy's action size), got {value}")
        if meta.discrete:
            if not (safe[0] == int(safe[0]) and 0 <= safe[0] < meta.n_actions):
                raise ValueError(f"safe_action of a discrete policy must be an action index in "
                                 f"[0, {meta.n_actions - 1}], got {value}")
        elif np.any(safe < meta.action_low) or np.any(safe > meta.action_high):
            raise ValueError(f"safe_action {safe.tolist()} is outside the policy's action bounds "
                             f"[{meta.action_low.tolist()}, {meta.action_high.tolist()}]")
        return safe

    def activate_controller(self) -> None:
        self._stale_warned = False
        self._control_timer = self.create_timer(1.0 / self.rate_hz, self.control_tick)
        self.controller_state = "active"
        self.stats.restart_window()

    def deactivate_controller(self) -> None:
        """Stop the timer and command the safe action once."""
        self.destroy_timer(self._control_timer)
        self._control_timer = None
        self.controller_state = "inactive"
        self.publish_action(self.safe_action, safe=True)

    def release_controller(self) -> None:
        """Back to unconfigured: unsubscribe, stop advertising, drop the policy (and its session)."""
        if self._control_timer is not None:
            self.destroy_timer(self._control_timer)
            self._control_timer = None
        for subscription in self._input_subscriptions:
            self.destroy_subscription(subscription)
        self._input_subscriptions = []
        if self._action_publisher is not None:
            self.destroy_action_publisher(self._action_publisher)
            self._action_publisher = None
        self.policy, self.rate_hz, self.stats = None, 0.0, ControlStats()
        self.observation = self.goal = self.observation_time = self.goal_time = None
        self.controller_state = "unconfigured"

    def make_action_publisher(self, topic: str, qos):
        return self.create_publisher(Float64MultiArray, topic, qos)

    def destroy_action_publisher(self, publisher) -> None:
        self.destroy_publisher(publisher)

    # -- inputs --------------------------------------------------------------------------------

    def on_observation(self, msg: Float64MultiArray) -> None:
        values = self.accepted("observation", msg.data, self.policy.metadata.obs_dim)
        if values is not None:
            self.observation, self.observation_time = values, self.get_clock().now()
            if self.trigger == "observation":
                self.control_tick()

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
        """The message's values as float32, or None (counted, warned) when the policy must not see
        them: wrong length, NaN/Inf, or finite values beyond float32 (they would become Inf)."""
        values = np.asarray(data, dtype=np.float64)
        problem = None
        if values.shape != (expected,):
            problem = f"has {values.size} values, expected {expected}"
        elif not np.all(np.isfinite(values)):
            problem = "contains NaN or Inf"
        elif np.abs(values).max() > FLOAT32_MAX:
            problem = f"holds {np.abs(values).max():g}, beyond float32's range (|x| <= {FLOAT32_MAX:.4g})"
        if problem is None:
            self.stats.accepted += 1
            return values.astype(np.float32)
        self.stats.rejected += 1
        self.get_logger().warning(f"rejected {name} message: it {problem}", throttle_duration_sec=WARN_THROTTLE_S)
        return None

    # -- output --------------------------------------------------------------------------------

    def inputs_fresh(self) -> bool:
        if self.observation is None or self.goal is None:
            return False
        oldest = min(self.observation_time, self.goal_time)
        return (self.get_clock().now() - oldest).nanoseconds * 1e-9 <= self.input_timeout_s

    def control_tick(self) -> None:
        if self.controller_state != "active":
            return  # an observation-triggered tick while inactive
        if not self.inputs_fresh():
            self.stats.stale += 1
            if not self._stale_warned:
                self.get_logger().warning(f"no observation and goal newer than {self.input_timeout_s:g}s: "
                                          f"publishing the safe action {self.safe_action.tolist()}")
                self._stale_warned = True
            self.publish_action(self.safe_action, safe=True)
            return
        self._stale_warned = False
        action = self.policy_action()
        if action is None:
            self.publish_action(self.safe_action, safe=True)
        else:
            self.publish_action(action, safe=False)

    def policy_action(self) -> np.ndarray | None:
        """The policy's action for the current inputs, clipped to its bounds; None (counted,
        logged) if inference fails or gives an action no actuator should get."""
        meta = self.policy.metadata
        started = time.perf_counter()
        try:
            raw = self.policy.act(self.observation, self.goal)
        except Exception as exc:  # noqa: BLE001 - a controller keeps commanding the safe action rather than die
            problem = f"inference failed: {type(exc).__name__}: {exc}"
        else:
            self.stats.record_latency(time.perf_counter() - started)
            action = np.asarray(raw, np.float64).reshape(-1)
            if meta.discrete:
                if action.shape == (1,) and 0 <= action[0] < meta.n_actions:
                    return action
                problem = f"the policy gave {action.tolist()}, not an action index in [0, {meta.n_actions - 1}]"
            elif action.shape == (meta.action_dim,) and np.all(np.isfinite(action)):
                return np.clip(action, meta.action_low, meta.action_high)
            else:
                problem = f"the policy gave {action.tolist()}, not {meta.action_dim} finite numbers"
        self.stats.errors += 1
        self.get_logger().error(f"{problem}; publishing the safe action", throttle_duration_sec=WARN_THROTTLE_S)
        return None

    def publish_action(self, action: np.ndarray, safe: bool) -> None:
        self._action_publisher.publish(Float64MultiArray(data=action.tolist()))
        self.stats.published += 1
        self.stats.safe += safe

    def publish_diagnostics(self) -> None:
        window = self.stats.close_window()
        self._diagnostics_publisher.publish(diagnostic_array(
            self.get_clock().now().to_msg(), f"{self.get_name()}: policy controller", self.controller_state,
            self.rate_hz, self.stats, window, self.policy.identity if self.policy is not None else None))


def run_node(make_node, argv=None, start=None) -> int:
    """The console entry point of both nodes: init, build, optionally ``start(node)``, spin until
    Ctrl-C or shutdown. A bad parameter or policy file exits with status 2 and the reason."""
    rclpy.init(args=argv if argv is not None else sys.argv)
    node = None
    try:
        node = make_node()
        if start is not None:
            start(node)
        rclpy.spin(node)
    except (ValueError, OSError) as exc:
        print(f"{NODE_NAME}: error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, rclpy.executors.ExternalShutdownException):
        pass
    finally:
        if node is not None:
            if node.controller_state == "active" and rclpy.ok():
                node.deactivate_controller()  # a stopping controller commands the safe action last
            node.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()
    return 0
