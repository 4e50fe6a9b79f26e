"""The ROS 2 policy controller with real rclpy (PyPI wheels): behaviour, diagnostics, parameters, the
launch file's structure and the console entry points (both nodes)."""

import ast
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import yaml

rclpy = pytest.importorskip("rclpy")  # in the ros and test extras; skip only on exotic platforms
from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from rclpy.time import Time  # noqa: E402
from geometry_msgs.msg import PointStamped  # noqa: E402
from std_msgs.msg import Float64MultiArray  # noqa: E402

from helpers import ROOT, describe, ros_domain_id  # noqa: E402
from deploy_policies import exported_policy  # noqa: E402
from her_mpi_runtime import Policy  # noqa: E402
from her_mpi_runtime.diagnostics import ControlStats, Window, diagnostic_array  # noqa: E402
from her_mpi_runtime.lifecycle_node import ManagedPolicyController  # noqa: E402
from her_mpi_runtime.ros_node import PolicyController  # noqa: E402
from ros_harness import Harness, new_context, problems_besides_rate  # noqa: E402

LAUNCH_FILE = ROOT / "launch" / "policy_controller.launch.py"
PARAMS_FILE = ROOT / "launch" / "policy_controller.yaml"


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    return exported_policy(tmp_path_factory)


@pytest.fixture
def harness(policy_file):
    created = []

    def make(**kwargs):
        created.append(Harness(PolicyController, policy_file, **kwargs))
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
    assert h.node.stats.rejected == 0


def test_a_zoo_policy_is_a_model_path():
    h = Harness(PolicyController, "zoo:fetch_reach")
    try:
        obs, goal = np.random.default_rng(1).normal(1.0, 0.3, 10), np.array([1.3, 0.7, 0.5])
        h.spin(0.5, publish=lambda: h.send(obs, goal))
        assert h.node.policy.metadata.env_id == "FetchReach-v4" and h.actions
        np.testing.assert_allclose(h.actions[-1], Policy("zoo:fetch_reach").act(obs, goal), atol=1e-6)
    finally:
        h.close()


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
    assert np.all(h.actions[-1] == 0.0) and h.node.stats.safe > 0


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
    assert h.node.stats.rejected == 3
    np.testing.assert_array_equal(h.node.observation, good_obs)  # the last good input is kept
    np.testing.assert_allclose(h.actions[-1], good_action)


def test_actions_are_clipped_to_the_bounds(harness):
    h = harness()
    # the exported policy clips its own output; the node clips again whatever a model gives
    h.node.policy.act = lambda obs, goal: np.array([5.0, -5.0, 0.5, -1e9])
    h.spin(0.5, publish=lambda: h.send(np.zeros(10), np.zeros(3)))
    np.testing.assert_array_equal(h.actions[-1], [1.0, -1.0, 0.5, -1.0])


def test_bad_parameters_fail_clearly(policy_file):
    context = new_context()
    cases = [({"model_path": ""}, "model_path is required"),
             ({"safe_action": [0.0]}, r"safe_action must be a list of 4 finite numbers \(the policy's action size\), got \[0.0\]"),
             ({"safe_action": "stop"}, "safe_action must be a list of 4 finite numbers, got 'stop'"),
             ({"safe_action": [True, False, True, False]}, "safe_action must be a list of 4 finite numbers"),
             ({"safe_action": [0.0, 0.0, 2.0, 0.0]}, r"outside the policy's action bounds"),
             ({"goal_type": "vector"}, "goal_type must be one of array, point, pose, got 'vector'"),
             ({"trigger": "sometimes"}, "trigger must be one of timer, observation, got 'sometimes'"),
             ({"rate_hz": -5.0}, "rate_hz must be > 0, got -5.0"),
             ({"input_timeout_s": 0.0}, "input_timeout_s must be > 0 seconds, got 0.0"),
             ({"model_path": "/nonexistent/policy.onnx"}, "no policy file at '/nonexistent/policy.onnx'"),
             ({"rate_hz": "fast"}, r"parameter rate_hz must be a number of Hz \(0: the policy's own\), got 'fast'"),
             ({"input_timeout_s": True}, "parameter input_timeout_s must be a number of seconds, got True"),
             ({"intra_op_threads": 1.5}, "parameter intra_op_threads must be an integer >= 0, got 1.5"),
             ({"goal_topic": "bad topic!"}, "parameter goal_topic: Invalid topic name: .* 'bad topic!'"),
             ({"diagnostics_topic": 7}, "parameter diagnostics_topic must be a topic name, got 7"),
             ({"goal_type": ["point"]}, r"parameter goal_type must be one of array, point, pose, got \['point'\]")]
    try:
        for params, message in cases:
            with pytest.raises((ValueError, FileNotFoundError), match=message):
                PolicyController(context=context, **{"model_path": str(policy_file), **params})
        # a running node refuses a later set of the wrong kind, as rclpy refused typed parameters
        node = PolicyController(context=context, model_path=str(policy_file))
        refused, accepted = node.set_parameters([rclpy.parameter.Parameter("rate_hz", value="fast"),
                                                 rclpy.parameter.Parameter("rate_hz", value=30)])
        assert not refused.successful and "parameter rate_hz must be a number of Hz" in refused.reason
        assert accepted.successful and node.get_parameter("rate_hz").value == 30
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)


def test_diagnostics_report_rate_latency_counts_and_the_policy_id(harness, policy_file):
    h = harness(input_timeout_s=0.3)
    identity = Policy(policy_file).identity
    obs, goal = np.full(10, 0.5), np.array([1.0, 0.5, 0.4])
    h.spin(1.2, publish=lambda: h.send(obs, goal))
    h.observation.publish(Float64MultiArray(data=[1.0] * 3))  # one rejected message
    h.spin(0.1, publish=lambda: h.goal.publish(Float64MultiArray(data=goal.tolist())))
    h.spin(1.2, publish=lambda: h.send(obs, goal))
    values = h.next_diagnostics(publish=lambda: h.send(obs, goal))
    for _ in range(3):  # on a loaded machine the window holding the rejection may be reported late
        if not problems_besides_rate(values["message"]):
            break
        values = h.next_diagnostics(publish=lambda: h.send(obs, goal))
    assert values["name"] == "her_policy_controller: policy controller"
    assert values["state"] == "active" and not problems_besides_rate(values["message"]), values["message"]
    assert values["level"] in (DiagnosticStatus.OK, DiagnosticStatus.WARN)
    assert values["policy_sha256"] == identity["sha256"] and len(identity["sha256"]) == 64
    assert (values["policy_env_id"], values["policy_algo"]) == ("FetchReach-v4", "ddpg")
    assert int(values["policy_train_env_steps"]) == identity["train_env_steps"] > 0
    assert float(values["rate_hz_nominal"]) == 50.0
    assert 0 < float(values["rate_hz_achieved"]) <= 55.0
    p50, p99 = float(values["inference_latency_p50_us"]), float(values["inference_latency_p99_us"])
    assert 0 < p50 <= p99 < 1e6
    assert int(values["rejected_inputs"]) == 1 and int(values["inference_errors"]) == 0
    assert int(values["actions_published"]) >= int(values["inferences"]) > 0

    h.spin(0.5)  # the inputs stop: stale ticks are counted and the status warns
    values = h.next_diagnostics()
    assert int(values["stale_inputs"]) > 0 and values["level"] == DiagnosticStatus.WARN, values
    assert "stale" in values["message"]


def window(**counts):
    return Window(**{"seconds": 1.0, "published": 50, "stale": 0, "rejected": 0, "errors": 0, **counts})


def test_diagnostic_levels_follow_the_window():
    stamp = Time().to_msg()

    def status(state="active", **counts):
        (status,) = diagnostic_array(stamp, "n", state, 50.0, ControlStats(), window(**counts), None).status
        return status.level, status.message

    assert status() == (DiagnosticStatus.OK, "running")
    assert status(published=46) == (DiagnosticStatus.OK, "running")  # within 10%
    assert status(published=44) == (DiagnosticStatus.WARN, "control rate 44.0 Hz, nominal 50 Hz")
    assert status(published=56)[0] == DiagnosticStatus.WARN
    assert status(stale=3) == (DiagnosticStatus.WARN, "inputs stale or missing at 3 tick(s), safe action published")
    assert status(rejected=2) == (DiagnosticStatus.WARN, "2 input message(s) rejected")
    level, message = status(errors=1, rejected=1)
    assert level == DiagnosticStatus.ERROR and message.startswith("1 inference error(s)") and "rejected" in message
    assert status("inactive", published=0) == (DiagnosticStatus.OK, "inactive: policy loaded, not publishing")
    assert status("unconfigured", published=0, stale=9) == (DiagnosticStatus.OK, "unconfigured: no policy loaded")


def test_latency_percentiles_cover_the_last_thousand_inferences():
    stats = ControlStats()
    assert all(np.isnan(stats.latency_percentiles_us()))
    for _ in range(1000):
        stats.record_latency(1.0)  # old and slow: pushed out of the ring
    for i in range(1000):
        stats.record_latency((1 + i % 100) * 1e-6)
    p50, p99 = stats.latency_percentiles_us()
    assert 50 <= p50 <= 51 and 99 <= p99 <= 100 and stats.inferences == 2000


# -- launch file: launch/launch_ros are not on PyPI, so check structure with recording stand-ins ---

def load_launch_description(monkeypatch):
    tree = ast.parse(LAUNCH_FILE.read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description" for n in tree.body)
    recorded = {"arguments": {}, "processes": []}

    class DeclareLaunchArgument:
        def __init__(self, name, default_value=None, description=""):
            assert description, name
            recorded["arguments"][name] = default_value

    class ExecuteProcess:
        def __init__(self, cmd, condition=None, **kwargs):
            recorded["processes"].append((cmd, condition))

    class LaunchConfiguration:
        def __init__(self, name):
            self.name = name

    class IfCondition:
        def __init__(self, predicate):
            self.when = (predicate.name, True)

    class UnlessCondition:
        def __init__(self, predicate):
            self.when = (predicate.name, False)

    fake = {name: types.ModuleType(name) for name in
            ("launch", "launch.actions", "launch.conditions", "launch.substitutions")}
    fake["launch"].LaunchDescription = lambda entities: entities
    fake["launch.actions"].DeclareLaunchArgument = DeclareLaunchArgument
    fake["launch.actions"].ExecuteProcess = ExecuteProcess
    fake["launch.conditions"].IfCondition = IfCondition
    fake["launch.conditions"].UnlessCondition = UnlessCondition
    fake["launch.substitutions"].LaunchConfiguration = LaunchConfiguration
    for name, module in fake.items():
        monkeypatch.setitem(sys.modules, name, module)
    namespace = {"__file__": str(LAUNCH_FILE)}
    exec(compile(LAUNCH_FILE.read_text(), str(LAUNCH_FILE), "exec"), namespace)
    entities = namespace["generate_launch_description"]()
    assert len(entities) == len(recorded["arguments"]) + len(recorded["processes"])
    return recorded


def overridden_parameters(cmd) -> set:
    return {cmd[i + 1][0] for i, part in enumerate(cmd) if part == "-p"}


def test_launch_file_declares_the_documented_arguments(monkeypatch):
    recorded = load_launch_description(monkeypatch)
    arguments = recorded["arguments"]
    for name in ("model_path", "rate_hz", "observation_topic", "goal_topic", "action_topic", "params_file",
                 "diagnostics_topic", "managed", "autostart"):
        assert name in arguments, name
    assert arguments["model_path"] is None  # required
    assert arguments["managed"] == "false"
    assert Path(arguments["params_file"]) == PARAMS_FILE
    processes = {cmd[2]: (cmd, condition.when) for cmd, condition in recorded["processes"]}
    assert set(processes) == {"her_mpi_runtime.ros_node", "her_mpi_runtime.lifecycle_node"}
    plain, managed = processes["her_mpi_runtime.ros_node"], processes["her_mpi_runtime.lifecycle_node"]
    assert plain[1] == ("managed", False) and managed[1] == ("managed", True)
    for cmd, _ in (plain, managed):
        assert "--params-file" in cmd and "__node:=her_policy_controller" in cmd
    assert "autostart" in overridden_parameters(managed[0]) - overridden_parameters(plain[0])


def test_launch_arguments_and_parameter_yaml_match_what_both_nodes_declare(monkeypatch, policy_file):
    recorded = load_launch_description(monkeypatch)
    params = yaml.safe_load(PARAMS_FILE.read_text())["her_policy_controller"]["ros__parameters"]
    commented = {line.split("#", 1)[1].split(":")[0].strip() for line in PARAMS_FILE.read_text().splitlines()
                 if line.strip().startswith("# ") and ":" in line and line.startswith("    #")}
    context = new_context()
    try:
        plain = PolicyController(context=context, **{**params, "model_path": str(policy_file)})
        managed = ManagedPolicyController(context=context, **{**params, "model_path": str(policy_file)})
        plain_declared, managed_declared = set(plain._parameters), set(managed._parameters)
        assert set(params) <= plain_declared & managed_declared, set(params) - (plain_declared & managed_declared)
        assert commented <= managed_declared and "safe_action" in commented, commented
        for cmd, condition in recorded["processes"]:
            declared = managed_declared if condition.when[1] else plain_declared
            assert overridden_parameters(cmd) <= declared, overridden_parameters(cmd) - declared
        assert plain.policy.metadata.env_id == "FetchReach-v4" and managed.policy is None  # managed: unconfigured
        plain.destroy_node()
        managed.destroy_node()
    finally:
        rclpy.shutdown(context=context)


def run_node_process(module, *args, seconds=3.0):
    code = ("import sys, threading, rclpy\n"
            f"from her_mpi_runtime import {module}\n"
            f"stop = threading.Timer({seconds}, lambda: rclpy.shutdown()); stop.daemon = True; stop.start()\n"
            f"sys.exit({module}.main(sys.argv))\n")
    env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id()))
    return subprocess.run([sys.executable, "-c", code, "--ros-args", "--params-file", str(PARAMS_FILE), *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_node_runs_as_a_process_with_ros_args(policy_file):
    # whole numbers for the float parameters, as people write them (rclpy reads them as integers)
    result = run_node_process("ros_node", "-p", f"model_path:={policy_file}", "-p", "rate_hz:=25",
                              "-p", "input_timeout_s:=1")
    assert result.returncode == 0, describe(result)
    assert "policy for FetchReach-v4" in result.stderr + result.stdout and "25 Hz, timeout 1s" in result.stderr


def test_managed_node_autostarts_as_a_process_and_bad_files_exit_2(policy_file, tmp_path):
    result = run_node_process("lifecycle_node", "-p", f"model_path:={policy_file}", "-p", "autostart:=true")
    assert result.returncode == 0, describe(result)
    assert "policy for FetchReach-v4" in result.stderr + result.stdout
    result = run_node_process("lifecycle_node", "-p", "autostart:=true", seconds=10.0)
    assert result.returncode == 2, describe(result)
    assert "autostart: configure failed: parameter model_path is required" in result.stderr, describe(result)
    result = run_node_process("lifecycle_node", "-p", f"model_path:={policy_file}", "-p", "autostart:=1")
    assert result.returncode == 2, describe(result)
    assert "parameter autostart must be true or false, got 1" in result.stderr, describe(result)
    not_onnx = tmp_path / "policy.onnx"
    not_onnx.write_text("not a model")
    result = run_node_process("ros_node", "-p", f"model_path:={not_onnx}", seconds=10.0)
    assert result.returncode == 2 and "is not a loadable ONNX model" in result.stderr, describe(result)


@pytest.mark.parametrize("module", ["ros_node", "lifecycle_node"])
@pytest.mark.parametrize("missing", ["rclpy", "diagnostic_msgs"])
def test_a_missing_ros_install_says_what_to_install(module, missing):
    code = f"import sys; sys.modules[{missing!r}] = None; import her_mpi_runtime.{module}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"but {missing} is missing: pip install \"her_mpi_runtime[ros]\"" in result.stderr, describe(result)
