"""The ROS 2 policy controller with real rclpy (PyPI wheels), plus the launch file's structure."""

import ast
import os
import random
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import yaml

rclpy = pytest.importorskip("rclpy")  # installed by setup.py; skip only on exotic platforms
from geometry_msgs.msg import PointStamped  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from std_msgs.msg import Float64MultiArray  # noqa: E402

from conftest import ROOT, TINY, describe, run_python  # noqa: E402
from her_mpi_runtime import Policy  # noqa: E402
from her_mpi_runtime.ros_node import PolicyController  # noqa: E402

LAUNCH_FILE = ROOT / "launch" / "policy_controller.launch.py"
PARAMS_FILE = ROOT / "launch" / "policy_controller.yaml"


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("ros")
    result = run_python(["-m", "her_mpi.train", "--run-dir", root / "run", "--set", "train.n_epochs=1", *TINY])
    assert result.returncode == 0, describe(result)
    result = run_python(["-m", "her_mpi.export", "--checkpoint", root / "run", "--output", root / "policy.onnx",
                         "--no-verify"])
    assert result.returncode == 0, describe(result)
    return root / "policy.onnx"


class Harness:
    """The controller plus a test node that publishes inputs and records actions."""

    def __init__(self, policy_file, goal_type="array", **params):
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=random.randint(100, 200))
        self.node = PolicyController(context=self.context, model_path=str(policy_file), goal_type=goal_type,
                                     rate_hz=50.0, **params)
        self.tester = rclpy.create_node("tester", context=self.context)
        self.actions = []
        self.tester.create_subscription(Float64MultiArray, "action", lambda m: self.actions.append(np.array(m.data)), 10)
        self.observation = self.tester.create_publisher(Float64MultiArray, "observation", 10)
        goal_msg = PointStamped if goal_type == "point" else Float64MultiArray
        self.goal = self.tester.create_publisher(goal_msg, "desired_goal", 10)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.tester)

    def spin(self, seconds, publish=None):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if publish:
                publish()
            self.executor.spin_once(timeout_sec=0.005)

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


@pytest.fixture
def harness(policy_file):
    created = []

    def make(**kwargs):
        created.append(Harness(policy_file, **kwargs))
        return created[-1]

    yield make
    for h in created:
        h.close()


def test_publishes_the_policy_action(harness, policy_file):
    h = harness()
    obs, goal = np.random.default_rng(0).normal(1.0, 0.3, 10), np.array([1.3, 0.7, 0.5])
    h.spin(1.0, publish=lambda: h.send(obs, goal))
    expected = Policy(policy_file).act(obs, goal)
    assert len(h.actions) >= 10
    np.testing.assert_allclose(h.actions[-1], expected, atol=1e-6)
    assert h.node.counts["rejected"] == 0


def test_point_goals_are_accepted_for_3d_goals(harness, policy_file):
    h = harness(goal_type="point")
    obs = np.random.default_rng(1).normal(1.0, 0.3, 10)
    point = PointStamped()
    point.point.x, point.point.y, point.point.z = 1.2, 0.8, 0.45
    h.spin(1.0, publish=lambda: h.send(obs, point))
    np.testing.assert_allclose(h.actions[-1], Policy(policy_file).act(obs, [1.2, 0.8, 0.45]), atol=1e-6)


def test_stale_or_missing_input_gives_the_safe_action(harness):
    h = harness(input_timeout_s=0.2, safe_action=[0.0, 0.0, 0.0, 0.0])
    h.spin(0.3)  # nothing received yet
    assert h.actions and np.all(h.actions[-1] == 0.0)
    h.spin(0.5, publish=lambda: h.send(np.ones(10), np.ones(3)))
    assert np.any(h.actions[-1] != 0.0)
    h.spin(0.5)  # the inputs stop: after 0.2 s the node falls back to the safe action
    assert np.all(h.actions[-1] == 0.0) and h.node.counts["safe"] > 0


def test_bad_messages_are_rejected_and_never_reach_the_policy(harness):
    h = harness(input_timeout_s=5.0)
    good_obs, goal = np.full(10, 0.5), np.array([1.0, 0.5, 0.4])
    h.spin(0.4, publish=lambda: h.send(good_obs, goal))
    good_action = h.actions[-1].copy()
    # the node keeps only the latest message per topic (a controller wants the newest), so
    # give each bad message time to arrive
    h.observation.publish(Float64MultiArray(data=[1.0] * 9))  # wrong length
    h.spin(0.2)
    h.observation.publish(Float64MultiArray(data=[float("nan")] + [0.0] * 9))
    h.spin(0.2)
    h.goal.publish(Float64MultiArray(data=[0.0, float("inf"), 0.0]))
    h.spin(0.2)
    assert h.node.counts["rejected"] == 3
    np.testing.assert_array_equal(h.node.observation, good_obs)  # the last good input is kept
    np.testing.assert_allclose(h.actions[-1], good_action)


def test_actions_are_clipped_to_the_bounds(harness):
    h = harness()
    h.spin(0.5, publish=lambda: h.send(np.full(10, 1e3), np.full(3, -1e3)))
    assert np.all(np.abs(h.actions[-1]) <= 1.0)


def test_bad_parameters_fail_clearly(policy_file):
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=random.randint(100, 200))
    try:
        with pytest.raises(ValueError, match="model_path is required"):
            PolicyController(context=context)
        with pytest.raises(ValueError, match="safe_action must hold 4"):
            PolicyController(context=context, model_path=str(policy_file), safe_action=[0.0])
        with pytest.raises(ValueError, match="goal_type must be one of"):
            PolicyController(context=context, model_path=str(policy_file), goal_type="vector")
    finally:
        rclpy.shutdown(context=context)


# -- launch file: launch/launch_ros are not on PyPI, so check structure with recording stand-ins ---

def test_launch_file_declares_the_documented_arguments(monkeypatch, policy_file):
    tree = ast.parse(LAUNCH_FILE.read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description" for n in tree.body)

    recorded = {"arguments": {}, "processes": []}

    class DeclareLaunchArgument:
        def __init__(self, name, default_value=None, description=""):
            recorded["arguments"][name] = default_value

    class ExecuteProcess:
        def __init__(self, cmd, **kwargs):
            recorded["processes"].append(cmd)

    class LaunchConfiguration:
        def __init__(self, name):
            self.name = name

    fake = {"launch": types.ModuleType("launch"), "launch.actions": types.ModuleType("launch.actions"),
            "launch.substitutions": types.ModuleType("launch.substitutions")}
    fake["launch"].LaunchDescription = lambda entities: entities
    fake["launch.actions"].DeclareLaunchArgument = DeclareLaunchArgument
    fake["launch.actions"].ExecuteProcess = ExecuteProcess
    fake["launch.substitutions"].LaunchConfiguration = LaunchConfiguration
    for name, module in fake.items():
        monkeypatch.setitem(sys.modules, name, module)
    namespace = {"__file__": str(LAUNCH_FILE)}
    exec(compile(LAUNCH_FILE.read_text(), str(LAUNCH_FILE), "exec"), namespace)
    entities = namespace["generate_launch_description"]()

    assert len(entities) == len(recorded["arguments"]) + 1
    for name in ("model_path", "rate_hz", "observation_topic", "goal_topic", "action_topic", "params_file"):
        assert name in recorded["arguments"], name
    assert recorded["arguments"]["model_path"] is None  # required
    assert Path(recorded["arguments"]["params_file"]) == PARAMS_FILE
    (cmd,) = recorded["processes"]
    assert "her_mpi_runtime.ros_node" in cmd and "--params-file" in cmd


def test_parameter_yaml_matches_what_the_node_declares(policy_file):
    params = yaml.safe_load(PARAMS_FILE.read_text())["her_policy_controller"]["ros__parameters"]
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=random.randint(100, 200))
    try:
        node = PolicyController(context=context, **{**params, "model_path": str(policy_file)})
        declared = {name for name in node._parameters}
        assert set(params) <= declared, set(params) - declared
        assert node.policy.metadata.env_id == "FetchReach-v4"
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)


def test_node_runs_as_a_process_with_ros_args(policy_file):
    code = ("import sys, threading, rclpy\n"
            "from her_mpi_runtime import ros_node\n"
            "threading.Timer(2.0, lambda: rclpy.shutdown()).start()\n"
            "sys.exit(ros_node.main(sys.argv))\n")
    env = dict(os.environ, ROS_DOMAIN_ID=str(random.randint(100, 200)))
    import subprocess

    result = subprocess.run([sys.executable, "-c", code, "--ros-args", "--params-file", str(PARAMS_FILE),
                             "-p", f"model_path:={policy_file}"], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, describe(result)
    assert "policy for FetchReach-v4" in result.stderr + result.stdout
