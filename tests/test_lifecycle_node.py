"""The managed (lifecycle) policy controller with real rclpy: transitions through its lifecycle
services and trigger methods, what each state publishes, and its diagnostics."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

rclpy = pytest.importorskip("rclpy")  # in the ros and test extras
from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from std_msgs.msg import Float64MultiArray  # noqa: E402

from deploy_policies import exported_policy  # noqa: E402
from her_mpi_runtime import Policy  # noqa: E402
from her_mpi_runtime.lifecycle_node import ManagedPolicyController  # noqa: E402
from ros_harness import Harness, problems_besides_rate  # noqa: E402

SAFE = [0.1, -0.2, 0.0, 0.3]
OBS, GOAL = np.linspace(0.2, 1.4, 10), np.array([1.3, 0.7, 0.5])


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    return exported_policy(tmp_path_factory)


@pytest.fixture
def managed(policy_file):
    created = []

    def make(**params):
        created.append(LifecycleClient(Harness(ManagedPolicyController, policy_file, safe_action=SAFE, **params)))
        return created[-1]

    yield make
    for client in created:
        client.h.close()


class LifecycleClient:
    """Drives the node through its lifecycle services, as `ros2 lifecycle set` does."""

    def __init__(self, harness):
        self.h = harness
        name = harness.node.get_fully_qualified_name()
        self.change = harness.tester.create_client(ChangeState, f"{name}/change_state")
        self.get = harness.tester.create_client(GetState, f"{name}/get_state")
        assert self.change.wait_for_service(timeout_sec=10) and self.get.wait_for_service(timeout_sec=10)

    def call(self, client, request):
        future = client.call_async(request)
        self.h.executor.spin_until_future_complete(future, timeout_sec=10)
        assert future.done(), "no answer from the lifecycle service"
        return future.result()

    def transition(self, transition_id) -> bool:
        return self.call(self.change, ChangeState.Request(transition=Transition(id=transition_id))).success

    def state(self) -> str:
        return self.call(self.get, GetState.Request()).current_state.label

    def feed(self, seconds):
        self.h.spin(seconds, publish=lambda: self.h.send(OBS, GOAL))


def test_transitions_through_the_lifecycle_services(managed, policy_file):
    lc = managed()
    node, h = lc.h.node, lc.h
    assert lc.state() == "unconfigured" and node.policy is None
    lc.feed(0.3)
    assert h.action_count == 0

    assert lc.transition(Transition.TRANSITION_CONFIGURE)
    assert lc.state() == "inactive" and node.policy.metadata.env_id == "FetchReach-v4"
    lc.feed(0.5)  # inputs flow in, but an inactive controller commands nothing
    assert h.action_count == 0 and node.stats.published == 0

    assert lc.transition(Transition.TRANSITION_ACTIVATE)
    assert lc.state() == "active"
    lc.feed(1.0)
    assert h.action_count >= 10
    np.testing.assert_allclose(h.actions[-1], Policy(policy_file).act(OBS, GOAL), atol=1e-6)

    safe = node.stats.safe
    assert lc.transition(Transition.TRANSITION_DEACTIVATE)
    assert lc.state() == "inactive" and node.stats.safe == safe + 1  # the safe action, once
    published = node.stats.published
    lc.feed(0.8)
    assert node.stats.published == published  # and nothing after it
    np.testing.assert_array_equal(h.actions[-1], SAFE)
    received = h.action_count
    lc.feed(0.3)
    assert h.action_count == received

    policy = weakref.ref(node.policy)
    assert lc.transition(Transition.TRANSITION_CLEANUP)
    assert lc.state() == "unconfigured" and node.policy is None
    gc.collect()
    assert policy() is None, "cleanup kept the model alive"
    assert not list(node.subscriptions) and not list(node.timers)[1:]  # unsubscribed; only diagnostics' timer

    assert lc.transition(Transition.TRANSITION_CONFIGURE) and lc.transition(Transition.TRANSITION_ACTIVATE)
    lc.feed(0.5)
    np.testing.assert_allclose(h.actions[-1], Policy(policy_file).act(OBS, GOAL), atol=1e-6)
    published = node.stats.published
    assert lc.transition(Transition.TRANSITION_ACTIVE_SHUTDOWN)
    assert lc.state() == "finalized" and node.policy is None
    assert node.stats.published == 0  # released: counts restart with the next policy
    lc.feed(0.3)
    np.testing.assert_array_equal(h.actions[-1], SAFE)  # shutting down from active: the safe action last
    assert published > 0


def test_trigger_methods_and_a_failed_configure(managed, policy_file):
    lc = managed(rate_hz=40.0)
    node = lc.h.node
    assert node.trigger_activate() == TransitionCallbackReturn.ERROR  # not configured yet
    node.set_parameters([Parameter("model_path", value="/nonexistent/policy.onnx")])
    assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
    assert lc.state() == "unconfigured" and "no policy file at '/nonexistent/policy.onnx'" in node.configure_error
    node.set_parameters([Parameter("model_path", value=str(policy_file)),
                         Parameter("safe_action", value=[5.0, 0.0, 0.0, 0.0])])
    assert not lc.transition(Transition.TRANSITION_CONFIGURE)
    assert "outside the policy's action bounds" in node.configure_error and lc.state() == "unconfigured"
    node.set_parameters([Parameter("safe_action", value=SAFE)])
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
    assert node.rate_hz == 40.0 and lc.state() == "active"
    lc.feed(0.5)
    assert lc.h.action_count > 5
    assert node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_cleanup() == TransitionCallbackReturn.SUCCESS and node.policy is None


def test_diagnostics_in_every_state(managed, policy_file):
    lc = managed(input_timeout_s=0.3)
    h = lc.h
    values = h.next_diagnostics()
    assert values["state"] == "unconfigured" and values["policy_sha256"] == ""
    assert "no policy loaded" in values["message"]

    assert lc.transition(Transition.TRANSITION_CONFIGURE)
    values = h.next_diagnostics()
    assert values["state"] == "inactive" and values["policy_sha256"] == Policy(policy_file).sha256
    assert values["policy_env_id"] == "FetchReach-v4" and float(values["rate_hz_achieved"]) == 0

    assert lc.transition(Transition.TRANSITION_ACTIVATE)
    lc.feed(1.2)
    values = h.next_diagnostics(publish=lambda: h.send(OBS, GOAL))
    assert values["state"] == "active" and not problems_besides_rate(values["message"]), values["message"]
    assert float(values["inference_latency_p50_us"]) > 0 and int(values["inferences"]) > 0
    assert abs(float(values["rate_hz_achieved"]) - 50.0) < 25.0  # loosely: the rate test is in test_ros_fuzz

    assert lc.transition(Transition.TRANSITION_DEACTIVATE)
    values = h.next_diagnostics()
    assert values["state"] == "inactive" and int(values["safe_actions_published"]) >= 1


# Which trigger moves the node from which state, and where to (every other trigger is refused).
TRANSITIONS = {("unconfigured", "configure"): "inactive", ("inactive", "activate"): "active",
               ("active", "deactivate"): "inactive", ("inactive", "cleanup"): "unconfigured"}


def test_random_transition_sequences_with_fuzzed_inputs(managed, policy_file):
    """Hypothesis drives the node through random sequences of transitions, valid or not, with good
    and bad inputs in between: it follows the lifecycle state machine, refuses what the state does
    not allow, commands nothing unless active (but the one safe action on deactivate), and every
    action is finite and inside the bounds."""
    lc = managed(input_timeout_s=0.2)
    h, node, meta = lc.h, lc.h.node, Policy(policy_file).metadata
    inputs = st.one_of(
        st.just("good inputs"),
        st.builds(lambda values: ("observation", values), st.lists(st.floats(), min_size=0, max_size=12)),
        st.builds(lambda values: ("goal", values), st.lists(st.floats(), min_size=2, max_size=4)))
    operation = st.one_of(st.sampled_from(["configure", "activate", "deactivate", "cleanup", "spin"]), inputs)
    tally = {"examples": 0, "operations": 0, "refused transitions": 0}

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(operations=st.lists(operation, min_size=1, max_size=10))
    def check(operations):
        tally["examples"] += 1
        state = node.controller_state
        for op in operations:
            tally["operations"] += 1
            since, published, safe = h.action_count, node.stats.published, node.stats.safe
            if op in ("configure", "activate", "deactivate", "cleanup"):
                result = getattr(node, f"trigger_{op}")()
                target = TRANSITIONS.get((state, op))
                assert (result == TransitionCallbackReturn.SUCCESS) == (target is not None), (state, op, result)
                tally["refused transitions"] += target is None
                if op == "deactivate" and target:
                    assert node.stats.safe == safe + 1 and node.stats.published == published + 1
                state = target or state
                assert node.controller_state == state
                continue
            if op == "good inputs":
                h.send(OBS, GOAL)
            elif op != "spin" and node.policy is not None:
                publisher = h.observation if op[0] == "observation" else h.goal
                publisher.publish(Float64MultiArray(data=op[1]))
            h.spin(0.03)
            if state != "active":
                assert node.stats.published == published, f"published while {state}"
            for action in list(h.actions)[len(h.actions) - (h.action_count - since):]:
                assert action.shape == (meta.action_dim,) and np.all(np.isfinite(action))
                assert np.all(action >= meta.action_low) and np.all(action <= meta.action_high)
        for op in {"active": ["deactivate", "cleanup"], "inactive": ["cleanup"]}.get(state, []):
            assert getattr(node, f"trigger_{op}")() == TransitionCallbackReturn.SUCCESS
        assert node.controller_state == "unconfigured" and node.policy is None

    check()
    print(f"\nlifecycle fuzz: {tally}")
    assert tally["refused transitions"] >= 3, tally
