"""A trained policy controlling a simulated robot through ROS 2 (her_mpi.ros_sim): the controller in
its own process exactly as deployed, real rclpy topics between them, and impairments that do what
they say."""

import json
import subprocess
import sys

import numpy as np
import pytest

from helpers import ROOT, ros_domain_id

pytest.importorskip("rclpy", reason="the ROS 2 wheels: pip install -e '.[ros]'")

from her_mpi.ros_sim import Link  # noqa: E402

POLICY = "zoo:fetch_reach"


def ros_sim(*args, timeout=300) -> dict:
    result = subprocess.run([sys.executable, "-m", "her_mpi.ros_sim", "--policy", POLICY,
                             "--domain-id", str(ros_domain_id()), *map(str, args)],
                            capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def evaluate(episodes: int, seed: int) -> dict:
    result = subprocess.run([sys.executable, "-m", "her_mpi.evaluate", "--policy", POLICY, "--episodes", str(episodes),
                             "--seed", str(seed), "--parallel-envs", "1"], capture_output=True, text=True, timeout=300,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_fetch_reach_through_ros_succeeds_as_in_direct_evaluation():
    through_ros = ros_sim("--episodes", 20, "--seed", 7)
    direct = evaluate(20, 7)
    assert through_ros["episodes"] == 20 and through_ros["env_id"] == "FetchReach-v4"
    assert through_ros["success_rate"] >= direct["success_rate"] - 0.1, (through_ros, direct)
    assert through_ros["e2e_latency_ms"]["timed"] >= 500  # nearly every observation's action was matched


def test_the_lifecycle_controller_publishes_the_safe_action_when_inputs_stop_and_recovers():
    timeout = 0.3
    result = ros_sim("--controller", "lifecycle", "--episodes", 1, "--stop-inputs-s", 1.5,
                     "--input-timeout-s", timeout, "--trigger", "timer")
    stop = result["inputs_stopped"]
    # the controller notices at its first timer tick past the timeout (one control period, 0.04 s)
    assert timeout <= stop["safe_action_after_s"] <= timeout + 0.04 + 0.25, stop
    assert stop["recovered_after_s"] is not None and stop["recovered_after_s"] < 0.3, stop
    assert result["controller_safe_actions"] >= (1.5 - timeout) / 0.04 * 0.5


def test_an_added_latency_is_measured_back_and_drops_happen_at_their_rate():
    result = ros_sim("--episodes", 3, "--latency-ms", 30, "--drop", 0.3)
    p50 = result["e2e_latency_ms"]["p50"]
    assert 60 <= p50 <= 60 + 25, result["e2e_latency_ms"]  # 30 ms each way, plus the loop's own few
    for direction in ("observations", "actions"):
        sent, dropped = result[direction]["sent"], result[direction]["dropped"]
        assert sent > 100 and 0.18 < dropped / sent < 0.42, result[direction]


def test_a_link_delays_reorders_within_its_jitter_and_drops():
    rng = np.random.default_rng(0)
    link = Link(0.05, 0.02, 0.0, rng)
    for i in range(1000):
        link.send(i, now=i * 0.001)
    assert link.due(0.029) == []  # nothing arrives before latency - jitter
    delivered = link.due(10.0)
    assert sorted(delivered) == list(range(1000)) and delivered != list(range(1000))  # jitter reorders
    lossy = Link(0.0, 0.0, 0.3, rng)
    for i in range(10_000):
        lossy.send(i, now=0.0)
    assert lossy.dropped + len(lossy.due(0.0)) == 10_000 and 0.28 < lossy.dropped / 10_000 < 0.32


@pytest.mark.parametrize("args, message", [
    (["--drop", "1"], "--drop 1.0"),
    (["--latency-ms", "5", "--jitter-ms", "10"], "cannot arrive before it was sent"),
    (["--episodes", "0"], "--episodes 0"),
    (["--seed", "-1"], "--seed -1: expected an integer >= 0"),
    (["--stop-inputs-s", "inf"], "--stop-inputs-s inf: expected a finite number >= 0"),
])
def test_bad_input_is_named(args, message):
    result = subprocess.run([sys.executable, "-m", "her_mpi.ros_sim", "--policy", POLICY, *args],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_an_unknown_zoo_policy_is_named():
    result = subprocess.run([sys.executable, "-m", "her_mpi.ros_sim", "--policy", "zoo:fetch_puhs"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2 and "no zoo policy 'fetch_puhs'" in result.stderr
