"""Property-based fuzzing of the ROS 2 policy controller with hypothesis and real rclpy.

Messages of random lengths and values (NaN, Inf, huge, subnormal, float32's edge, empty, thousands
of values), messages of the wrong type on the controller's topics, and bursts at 10x the control
rate. Properties: the node never raises out of a callback; every message it accepts is exactly the
one sent and every one it refuses is counted; every action it publishes is finite and inside the
policy's bounds; under a burst its publish rate stays within 10% of its own nominal rate, and its
memory does not grow.
"""

from __future__ import annotations

import gc
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

rclpy = pytest.importorskip("rclpy")  # in the ros and test extras
from geometry_msgs.msg import PointStamped  # noqa: E402
from std_msgs.msg import Float32MultiArray, Float64MultiArray, Int64MultiArray, String  # noqa: E402

from deploy_policies import exported_policy  # noqa: E402
from her_mpi_runtime import Policy  # noqa: E402
from her_mpi_runtime.policy import FLOAT32_MAX  # noqa: E402
from her_mpi_runtime.ros_node import PolicyController  # noqa: E402
from ros_harness import Harness  # noqa: E402

SETTINGS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
POISON = [float("nan"), float("inf"), -float("inf"), 1e39, -1e300, 1.8e308, FLOAT32_MAX, -FLOAT32_MAX, 5e-324, -0.0]
WAIT_S = 5.0  # for a message to reach the node; generous for a loaded machine


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    return exported_policy(tmp_path_factory)


def float_values(dim: int):
    """Mostly `dim` ordinary numbers, sometimes one poisoned entry, sometimes any length."""
    ordinary = st.lists(st.floats(-500, 500), min_size=dim, max_size=dim)

    @st.composite
    def poisoned(draw):
        values = draw(ordinary)
        values[draw(st.integers(0, dim - 1))] = draw(st.sampled_from(POISON))
        return values

    any_length = st.one_of(st.lists(st.floats(), max_size=dim + 4), st.just([0.5] * 5000), st.just([]))
    return st.one_of(ordinary, ordinary, poisoned(), any_length)


def acceptable(values, dim: int) -> bool:
    array = np.asarray(values, np.float64)
    return array.shape == (dim,) and bool(np.isfinite(array).all()) and float(np.abs(array).max()) <= FLOAT32_MAX


class Intruders:
    """Publishers of the wrong message types on the controller's topics. DDS allows one type per
    topic in a participant, so each type gets its own context (participant) on the same domain."""

    TYPES = {"observation": [String, Float32MultiArray], "desired_goal": [Int64MultiArray, Float64MultiArray]}

    def __init__(self, domain_id: int, goal_type: type):
        self.contexts, self.nodes, self.publishers = [], [], {}
        for topic, types in self.TYPES.items():
            for msg_type in types:
                if topic == "desired_goal" and msg_type is goal_type:
                    msg_type = PointStamped  # wrong for an array goal
                context = rclpy.Context()
                rclpy.init(context=context, domain_id=domain_id)
                node = rclpy.create_node(f"intruder_{len(self.nodes)}", context=context)
                self.contexts.append(context)
                self.nodes.append(node)
                self.publishers[(topic, msg_type.__name__)] = (node.create_publisher(msg_type, topic, 10), msg_type)

    def close(self):
        for node, context in zip(self.nodes, self.contexts):
            node.destroy_node()
            rclpy.shutdown(context=context)


@pytest.fixture(scope="module")
def rig(policy_file):
    """A controller acting on every observation as well as at 50 Hz, with a long input timeout so
    fuzzed inputs reach the policy; plus wrong-type publishers on its topics."""
    h = Harness(PolicyController, policy_file, trigger="observation", input_timeout_s=60.0, keep_actions=5000)
    intruders = Intruders(h.context.get_domain_id(), Float64MultiArray)
    yield h, intruders
    intruders.close()
    h.close()


def check_new_actions(h, meta, since: int):
    new = h.action_count - since
    assert new <= len(h.actions), "more actions than the harness keeps; raise keep_actions"
    for action in list(h.actions)[len(h.actions) - new:]:
        assert action.shape == (meta.action_dim,), action
        assert np.all(np.isfinite(action)), action
        assert np.all(action >= meta.action_low) and np.all(action <= meta.action_high), action
    return new


def test_fuzzed_messages_never_crash_the_node_or_reach_the_actuator(rig, policy_file):
    h, intruders = rig
    node, meta = h.node, Policy(policy_file).metadata
    policy = Policy(policy_file)
    dims = {"observation": meta.obs_dim, "desired_goal": meta.goal_dim}
    publishers = {"observation": h.observation, "desired_goal": h.goal}
    tally = {"examples": 0, "messages": 0, "accepted": 0, "rejected": 0, "wrong type": 0, "actions checked": 0}

    array_message = st.sampled_from(sorted(dims)).flatmap(
        lambda topic: st.tuples(st.just(topic), st.just("array"), float_values(dims[topic])))
    wrong_type = st.tuples(st.sampled_from(sorted(intruders.publishers)), st.just("wrong type"), st.none())
    message = st.one_of(array_message, array_message, array_message, wrong_type)

    @settings(max_examples=200, **SETTINGS)
    @given(messages=st.lists(message, min_size=1, max_size=4))
    def check(messages):
        tally["examples"] += 1
        since = h.action_count
        for topic, kind, values in messages:
            tally["messages"] += 1
            seen = node.stats.accepted + node.stats.rejected
            if kind == "wrong type":
                publisher, msg_type = intruders.publishers[topic]
                publisher.publish(msg_type())
                h.spin(0.02)
                assert node.stats.accepted + node.stats.rejected == seen, "a wrong-type message was taken"
                tally["wrong type"] += 1
                continue
            before = (node.observation if topic == "observation" else node.goal)
            publishers[topic].publish(Float64MultiArray(data=values))
            assert h.spin_until(lambda: node.stats.accepted + node.stats.rejected > seen, WAIT_S), "message lost"
            after = node.observation if topic == "observation" else node.goal
            if acceptable(values, dims[topic]):
                np.testing.assert_array_equal(after, np.asarray(values, np.float32))
                tally["accepted"] += 1
            else:
                assert after is before, f"refused {topic} replaced the last good one"
                tally["rejected"] += 1
        if node.observation is not None and node.goal is not None:
            expected = np.clip(policy.act(node.observation, node.goal), meta.action_low, meta.action_high)
            assert h.spin_until(lambda: h.action_count > since and np.allclose(h.actions[-1], expected, atol=1e-6),
                                WAIT_S), (list(h.actions)[-1:], expected)
        tally["actions checked"] += check_new_actions(h, meta, since)

    check()
    print(f"\nROS fuzz: {tally}; node counts: accepted {node.stats.accepted}, rejected {node.stats.rejected}, "
          f"actions {node.stats.published}, inference errors {node.stats.errors}")
    assert tally["accepted"] >= 50 and tally["rejected"] >= 30 and tally["wrong type"] >= 10, tally
    assert node.stats.errors == 0


def test_fuzzed_point_goals(policy_file):
    h = Harness(PolicyController, policy_file, goal_type="point", input_timeout_s=60.0, keep_actions=5000)
    meta = Policy(policy_file).metadata
    tally = {"examples": 0, "accepted": 0, "rejected": 0}
    coordinate = st.one_of(st.floats(-3, 3), st.sampled_from(POISON))
    try:
        h.send(np.full(meta.obs_dim, 0.5), _point(0.0, 0.0, 0.0))
        assert h.spin_until(lambda: h.node.stats.accepted == 2, WAIT_S)

        @settings(max_examples=60, **SETTINGS)
        @given(x=coordinate, y=coordinate, z=coordinate)
        def check(x, y, z):
            tally["examples"] += 1
            since, seen = h.action_count, h.node.stats.accepted + h.node.stats.rejected
            h.goal.publish(_point(x, y, z))
            assert h.spin_until(lambda: h.node.stats.accepted + h.node.stats.rejected > seen, WAIT_S), "message lost"
            if acceptable([x, y, z], 3):
                np.testing.assert_array_equal(h.node.goal, np.asarray([x, y, z], np.float32))
                tally["accepted"] += 1
            else:
                tally["rejected"] += 1
            h.spin(0.03)
            check_new_actions(h, meta, since)

        check()
    finally:
        h.close()
    print(f"\nROS point-goal fuzz: {tally}")
    assert tally["accepted"] >= 10 and tally["rejected"] >= 10, tally


def _point(x, y, z) -> PointStamped:
    point = PointStamped()
    point.point.x, point.point.y, point.point.z = float(x), float(y), float(z)
    return point


# -- bursts at 10x the control rate ------------------------------------------------------------

def burst(h, observations, goals, seconds: float, rate_hz: float):
    """Publish observation and goal messages in turn at ``rate_hz`` each for ``seconds`` while
    spinning; returns (messages sent per topic, node publishes, elapsed seconds)."""
    sent, published = 0, h.node.stats.published
    start = next_send = time.monotonic()
    while (now := time.monotonic()) - start < seconds:
        if now >= next_send:
            h.observation.publish(observations[sent % len(observations)])
            h.goal.publish(goals[sent % len(goals)])
            sent += 1
            next_send += 1.0 / rate_hz
        h.executor.spin_once(timeout_sec=max(0.0, min(0.002, next_send - time.monotonic())))
    return sent, h.node.stats.published - published, time.monotonic() - start


@pytest.fixture
def burst_rig(policy_file):
    # the policy's own rate; the test keeps few messages, so that its own memory stays flat
    h = Harness(PolicyController, policy_file, rate_hz=0.0, keep_actions=400, keep_diagnostics=2)
    yield h
    h.close()


def test_burst_at_ten_times_the_rate_keeps_the_publish_rate(burst_rig, policy_file):
    h = burst_rig
    meta, nominal = Policy(policy_file).metadata, h.node.rate_hz
    assert nominal == pytest.approx(meta.rate_hz) and nominal > 0
    results = []

    @settings(max_examples=4, **SETTINGS)
    @given(observations=st.lists(float_values(meta.obs_dim), min_size=1, max_size=30),
           goals=st.lists(float_values(meta.goal_dim), min_size=1, max_size=30))
    def check(observations, goals):
        observations = [Float64MultiArray(data=v) for v in observations]
        goals = [Float64MultiArray(data=v) for v in goals]
        burst(h, observations, goals, 0.5, 10 * nominal)  # settle into the burst
        since = h.action_count
        sent, published, seconds = burst(h, observations, goals, 3.0, 10 * nominal)
        results.append((sent / seconds, published / seconds))
        assert sent / seconds >= 9 * nominal, f"the test only managed {sent / seconds:.0f} messages/s"
        assert abs(published / seconds - nominal) <= 0.1 * nominal, \
            f"published {published / seconds:.2f} Hz under a {sent / seconds:.0f} Hz burst, nominal {nominal:g} Hz"
        h.spin(0.1)
        check_new_actions(h, meta, since)

    check()
    print("\nburst (messages/s per topic, actions/s): " + ", ".join(f"({m:.0f}, {a:.2f})" for m, a in results)
          + f"; nominal {nominal:g} Hz; inputs accepted {h.node.stats.accepted}, rejected {h.node.stats.rejected}")
    assert len(results) == 4


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_memory_does_not_grow_under_a_long_burst(burst_rig, policy_file):
    h = burst_rig
    meta, nominal = Policy(policy_file).metadata, h.node.rate_hz
    rng = np.random.default_rng(0)
    observations = [Float64MultiArray(data=rng.normal(0, 1, meta.obs_dim).tolist()) for _ in range(8)] + [
        Float64MultiArray(data=[float("nan")] * meta.obs_dim), Float64MultiArray(data=[1.0] * 3),
        Float64MultiArray(data=[1e300] * meta.obs_dim), Float64MultiArray(data=[0.5] * 5000)]
    goals = [Float64MultiArray(data=rng.normal(0, 1, meta.goal_dim).tolist()) for _ in range(4)] + [
        Float64MultiArray(data=[float("inf")] * meta.goal_dim)]
    burst(h, observations, goals, 3.0, 10 * nominal)  # warm-up: DDS pools, caches, the latency ring
    ours = [tracemalloc.Filter(True, "*her_mpi_runtime*")]
    ros = ours + [tracemalloc.Filter(True, "*rclpy*")]
    tracemalloc.start()
    try:
        burst(h, observations, goals, 3.0, 10 * nominal)
        gc.collect()
        start, rss_start = tracemalloc.take_snapshot(), rss_kib()
        sent, published, seconds = burst(h, observations, goals, 9.0, 10 * nominal)
        gc.collect()
        end, rss_end = tracemalloc.take_snapshot(), rss_kib()
    finally:
        tracemalloc.stop()

    def growth(filters):
        return sum(d.size_diff for d in end.filter_traces(filters).compare_to(start.filter_traces(filters), "filename"))

    print(f"\nmemory over {seconds:.1f} s, {2 * sent} messages in, {published} actions out: "
          f"her_mpi_runtime {growth(ours)} B, with rclpy {growth(ros)} B, RSS {rss_end - rss_start} KiB")
    assert 2 * sent >= 18 * nominal * seconds * 0.9
    assert growth(ours) <= 16 * 1024  # the controller itself holds nothing per message
    assert growth(ros) <= 256 * 1024  # rclpy's own caches settle; a leak of 50 B/message would be 225 KiB
    assert rss_end - rss_start <= 4 * 1024
