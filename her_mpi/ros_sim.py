"""A simulated robot in closed loop with a deployed policy controller, over real ROS 2 topics.

    python -m her_mpi.ros_sim --policy policy.onnx --episodes 20 [--latency-ms 20 --jitter-ms 5 --drop 0.1]

The simulator node steps the policy's own MuJoCo env in real time at the policy's control rate.
Every tick it publishes the observation and the goal on the controller's topics (``observation``
and ``desired_goal``, ``std_msgs/Float64MultiArray``: what the README tells a robot's driver to
publish), lets one control period pass, then applies the latest action it has received (zero-order
hold, as a motor driver does; the safe action, zeros, before the first) and steps the env. The
controller runs in its own process exactly as deployed: ``python -m her_mpi_runtime.ros_node``, or
the lifecycle node driven through configure and activate (``--controller lifecycle``).

Impairments act inside the simulator node, on observations and goals on their way out and on
actions on their way in: ``--latency-ms`` (each way), ``--jitter-ms`` (each message's delay is
uniform in latency +- jitter, so messages may overtake each other) and ``--drop`` (the probability
that a message is lost). ``--stop-inputs-s S`` stops publishing for S seconds in the middle of the
first episode (the env keeps stepping with what the controller sends) to time its safe action.

The episodes are those of ``python -m her_mpi.evaluate --policy FILE --seed SEED --parallel-envs 1``,
so a policy's success through ROS and in direct evaluation can be compared episode for episode.
End-to-end latency runs from an observation's publication to the arrival of the action computed
from it: the simulator computes each observation's action itself with the same file and matches
the actions that arrive by value. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np

from her_mpi.config import ConfigError
from her_mpi.evaluate import env_config_from_training

CONTROLLERS = {"node": "her_mpi_runtime.ros_node", "lifecycle": "her_mpi_runtime.lifecycle_node"}
READY_TIMEOUT_S = 60.0


class Link:
    """One direction of an impaired connection: delays messages by latency +- jitter, drops some."""

    def __init__(self, latency_s: float, jitter_s: float, drop: float, rng: np.random.Generator):
        self.latency_s, self.jitter_s, self.drop, self.rng = latency_s, jitter_s, drop, rng
        self.queue: list = []
        self.sent = self.dropped = 0

    def send(self, payload, now: float) -> None:
        self.sent += 1
        if self.drop and self.rng.random() < self.drop:
            self.dropped += 1
            return
        delay = self.latency_s + (self.rng.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0)
        heapq.heappush(self.queue, (now + max(delay, 0.0), self.sent, payload))

    def due(self, now: float) -> list:
        """The payloads whose delivery time has come, in delivery order."""
        out = []
        while self.queue and self.queue[0][0] <= now:
            out.append(heapq.heappop(self.queue)[2])
        return out


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m her_mpi.ros_sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", required=True, help="an .onnx file from python -m her_mpi.export, or zoo:NAME")
    parser.add_argument("--episodes", type=int, default=20, help="episodes to run (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="the episodes' seed, as her_mpi.evaluate's (default 0)")
    parser.add_argument("--controller", choices=sorted(CONTROLLERS), default="node",
                        help="node: her_mpi_runtime.ros_node; lifecycle: the managed node, configured and activated "
                             "through its change_state service (default node)")
    parser.add_argument("--trigger", choices=("observation", "timer"), default="observation",
                        help="the controller's trigger parameter (default observation: it answers each observation)")
    parser.add_argument("--input-timeout-s", type=float, default=0.5,
                        help="the controller's input_timeout_s (default 0.5, its own default)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added delay, each way (default 0)")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="delay spread: uniform in latency +- this")
    parser.add_argument("--drop", type=float, default=0.0, help="probability a message is lost, each way (default 0)")
    parser.add_argument("--stop-inputs-s", type=float, default=0.0,
                        help="stop publishing for this long in the middle of the first episode (default 0: never)")
    parser.add_argument("--domain-id", type=int, help="ROS_DOMAIN_ID of both nodes (default: a random one in 1-100, "
                                                       "so that other ROS 2 nodes on the network are not heard)")
    args = parser.parse_args(argv)
    problems = []
    if args.episodes < 1:
        problems.append(f"--episodes {args.episodes}: expected an integer >= 1")
    if args.seed < 0:
        problems.append(f"--seed {args.seed}: expected an integer >= 0")
    for name in ("latency_ms", "jitter_ms", "stop_inputs_s"):
        if not 0 <= getattr(args, name) < math.inf:
            problems.append(f"--{name.replace('_', '-')} {getattr(args, name)}: expected a finite number >= 0")
    if args.jitter_ms > args.latency_ms:
        problems.append(f"--jitter-ms {args.jitter_ms} is more than --latency-ms {args.latency_ms}: a message "
                        "cannot arrive before it was sent")
    if not 0 <= args.drop < 1:
        problems.append(f"--drop {args.drop}: expected a probability in [0, 1)")
    if not 0 < args.input_timeout_s < math.inf:
        problems.append(f"--input-timeout-s {args.input_timeout_s}: expected a finite number > 0")
    if args.domain_id is not None and not 0 <= args.domain_id <= 232:
        problems.append(f"--domain-id {args.domain_id}: expected a ROS_DOMAIN_ID in 0-232")
    if problems:
        raise ConfigError("; ".join(problems))
    return args


class Simulation:
    """The simulator node, its env, the two impaired links and what it measures."""

    def __init__(self, args, policy, env, context):
        import rclpy
        import rclpy.executors
        from diagnostic_msgs.msg import DiagnosticArray
        from std_msgs.msg import Float64MultiArray

        self.args, self.policy, self.env, self.meta = args, policy, env, policy.metadata
        self.Message = Float64MultiArray
        self.period_s = self.meta.control_period_s or float(env.unwrapped.dt)
        rng = np.random.default_rng(args.seed)
        latency, jitter = args.latency_ms / 1e3, args.jitter_ms / 1e3
        self.outgoing, self.incoming = Link(latency, jitter, args.drop, rng), Link(latency, jitter, args.drop, rng)
        self.node = rclpy.create_node("her_mpi_simulator", context=context)
        self.obs_publisher = self.node.create_publisher(Float64MultiArray, "observation", 10)
        self.goal_publisher = self.node.create_publisher(Float64MultiArray, "desired_goal", 10)
        self.node.create_subscription(Float64MultiArray, "action", self.on_action, 10)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self.on_diagnostics, 10)
        self.executor = rclpy.executors.SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.safe_action = np.zeros(self.meta.action_dim, np.float64)
        self.held = self.safe_action.copy()
        self.expected: dict[int, np.ndarray] = {}  # observation number -> the action it should get
        self.published_at: dict[int, float] = {}
        self.answered: set[int] = set()
        self.latencies_s: list[float] = []
        self.sequence = 0
        self.actions_received = 0
        self.diagnostics: list[dict] = []
        self.stop_measure: dict = {}
        self.counts_before: dict = {}
        self.still: tuple = ()  # the robot's last (observation, goal)

    # -- messages ------------------------------------------------------------------------------

    def on_action(self, msg) -> None:
        self.incoming.send(np.asarray(msg.data, np.float64), time.monotonic())

    def on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if status.name.endswith("policy controller"):
                self.diagnostics.append({kv.key: kv.value for kv in status.values})

    def publish(self, obs: np.ndarray, goal: np.ndarray) -> None:
        """Hand the observation to the outgoing link; remember the action it should bring back."""
        self.sequence += 1
        now = time.monotonic()
        action = np.asarray(self.policy.act(obs, goal), np.float64).reshape(-1)
        if not self.meta.discrete:
            action = np.clip(action, self.meta.action_low, self.meta.action_high)
        self.expected[self.sequence], self.published_at[self.sequence] = action, now
        self.expected.pop(self.sequence - 50, None)
        self.published_at.pop(self.sequence - 50, None)
        self.outgoing.send((obs.astype(np.float64).tolist(), goal.astype(np.float64).tolist()), now)

    def deliver(self) -> None:
        """Pass on what the links release now: observations to the controller, actions to the robot."""
        now = time.monotonic()
        for obs, goal in self.outgoing.due(now):
            self.obs_publisher.publish(self.Message(data=obs))
            self.goal_publisher.publish(self.Message(data=goal))
        for action in self.incoming.due(now):
            self.actions_received += 1
            self.held = action
            self._time_answer(action, now)
            self._watch_stop(action, now)

    def _time_answer(self, action: np.ndarray, now: float) -> None:
        matches = [s for s, a in self.expected.items() if a.shape == action.shape and np.array_equal(a, action)]
        if len(matches) == 1 and matches[0] not in self.answered:  # an ambiguous match is not timed
            self.answered.add(matches[0])
            self.latencies_s.append(now - self.published_at[matches[0]])

    def _watch_stop(self, action: np.ndarray, now: float) -> None:
        stop = self.stop_measure
        if "stopped_at" not in stop or "recovered_after_s" in stop:
            return
        is_safe = np.array_equal(action, self.safe_action)
        if "resumed_at" not in stop:
            if is_safe and "safe_after_s" not in stop:
                stop["safe_after_s"] = now - stop["last_input_at"]
        elif not is_safe:
            stop["recovered_after_s"] = now - stop["resumed_at"]

    def wait_until(self, deadline: float) -> None:
        while True:
            self.deliver()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.executor.spin_once(timeout_sec=min(left, 0.002))

    # -- the loop ------------------------------------------------------------------------------

    def wait_for_controller(self) -> None:
        """Publish a first observation until the controller answers (it is configured and active)."""
        o, _ = self.env.reset()
        self.still = np.ravel(o["observation"]).astype(np.float32), np.asarray(o["desired_goal"], np.float32)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.actions_received == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the controller did not answer within {READY_TIMEOUT_S:g} s")
            self.publish(*self.still)
            self.wait_until(time.monotonic() + 0.1)

    def stand_still(self, seconds: float) -> None:
        """Keep publishing the robot's last state at the control rate (a driver streams its state
        whether or not anything moves), so that the controller's inputs stay fresh meanwhile."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.publish(*self.still)
            self.wait_until(min(end, time.monotonic() + self.period_s))

    def run_episodes(self) -> list[float]:
        successes = []
        self.stand_still(1.2)  # a diagnostics message: the controller's counts before the episodes
        self.counts_before = dict(self.diagnostics[-1]) if self.diagnostics else {}
        self.latencies_s.clear()
        tick = time.monotonic()
        for episode in range(self.args.episodes):
            o, _ = self.env.reset()
            success = 0.0
            stop_at = self.env.spec.max_episode_steps // 2 if episode == 0 and self.args.stop_inputs_s else None
            for t in range(self.env.spec.max_episode_steps):
                obs, goal = np.ravel(o["observation"]).astype(np.float32), np.asarray(o["desired_goal"], np.float32)
                if t == stop_at:
                    tick, o = self.stop_inputs(tick, o)
                    obs, goal = np.ravel(o["observation"]).astype(np.float32), np.asarray(o["desired_goal"], np.float32)
                self.publish(obs, goal)
                tick += self.period_s
                self.wait_until(tick)
                o, _, terminated, truncated, info = self.env.step(self.applied_action())
                self.still = np.ravel(o["observation"]).astype(np.float32), np.asarray(o["desired_goal"], np.float32)
                success = float(info.get("is_success", 0.0))
                if terminated or truncated:
                    break
            successes.append(success)
        return successes

    def applied_action(self):
        """What the motor driver applies this tick: the latest action received (zero-order hold)."""
        return int(self.held[0]) if self.meta.discrete else self.held

    def stop_inputs(self, tick: float, o: dict) -> tuple[float, dict]:
        """Publish nothing for --stop-inputs-s (the env steps on with what arrives), then resume."""
        self.stop_measure = {"stopped_at": time.monotonic(), "last_input_at": self.published_at[self.sequence]}
        end = time.monotonic() + self.args.stop_inputs_s
        while tick < end:
            tick += self.period_s
            self.wait_until(tick)
            o, *_ = self.env.step(self.applied_action())
        self.stop_measure["resumed_at"] = time.monotonic()
        return tick, o

    def report(self, successes: list[float]) -> dict:
        latencies = np.asarray(self.latencies_s) * 1e3
        final = self.diagnostics[-1] if self.diagnostics else {}

        def during_episodes(key: str) -> int:
            return int(final.get(key, 0) or 0) - int(self.counts_before.get(key, 0) or 0)

        rates = [float(d["rate_hz_achieved"]) for d in self.diagnostics if d.get("state") == "active"]
        stop = self.stop_measure
        return {
            "policy": self.args.policy, "env_id": self.meta.env_id, "controller": self.args.controller,
            "trigger": self.args.trigger, "episodes": len(successes), "seed": self.args.seed,
            "success_rate": float(np.mean(successes)),
            "control_period_s": self.period_s, "latency_ms": self.args.latency_ms, "jitter_ms": self.args.jitter_ms,
            "drop": self.args.drop,
            "e2e_latency_ms": {"p50": float(np.percentile(latencies, 50)) if latencies.size else None,
                               "p99": float(np.percentile(latencies, 99)) if latencies.size else None,
                               "timed": int(latencies.size)},
            "observations": {"sent": self.outgoing.sent, "dropped": self.outgoing.dropped},
            "actions": {"sent": self.incoming.sent, "dropped": self.incoming.dropped},
            "controller_rate_hz_achieved": float(np.median(rates)) if rates else None,
            "controller_stale_inputs": during_episodes("stale_inputs"),
            "controller_safe_actions": during_episodes("safe_actions_published"),
            "controller_rejected_inputs": during_episodes("rejected_inputs"),
            "inputs_stopped": None if not stop else {
                "seconds": self.args.stop_inputs_s, "input_timeout_s": self.args.input_timeout_s,
                "safe_action_after_s": stop.get("safe_after_s"),
                "recovered_after_s": stop.get("recovered_after_s")},
        }


def controller_command(args, policy_path: str, period_s: float) -> list[str]:
    params = {"model_path": policy_path, "trigger": args.trigger, "input_timeout_s": float(args.input_timeout_s),
              "rate_hz": 1.0 / period_s}
    if args.controller == "lifecycle":
        params["autostart"] = False
    command = [sys.executable, "-m", CONTROLLERS[args.controller], "--ros-args"]
    for name, value in params.items():
        command += ["-p", f"{name}:={value}"]
    return command


def drive_lifecycle(sim: Simulation) -> None:
    """configure, then activate, through the managed node's change_state service."""
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState

    client = sim.node.create_client(ChangeState, "/her_policy_controller/change_state")
    if not client.wait_for_service(timeout_sec=READY_TIMEOUT_S):
        raise RuntimeError("the lifecycle controller's change_state service did not appear")
    for transition in (Transition.TRANSITION_CONFIGURE, Transition.TRANSITION_ACTIVATE):
        future = client.call_async(ChangeState.Request(transition=Transition(id=transition)))
        sim.executor.spin_until_future_complete(future, timeout_sec=30)
        if not (future.done() and future.result().success):
            raise RuntimeError(f"lifecycle transition {transition} failed")


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        from her_mpi_runtime import Policy
        from her_mpi_runtime.zoo import resolve

        policy_path = str(resolve(args.policy))
        policy = Policy(policy_path)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"her_mpi.ros_sim: error: {exc}", file=sys.stderr)
        return 2
    import rclpy
    from her_mpi.rollout import RolloutWorker

    # the env and episodes of her_mpi.evaluate --seed SEED --parallel-envs 1
    worker = RolloutWorker(env_config_from_training(policy.metadata.training_config), 1,
                           np.random.SeedSequence(args.seed))
    domain = args.domain_id if args.domain_id is not None else random.randint(1, 100)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    sim = controller = None
    try:
        sim = Simulation(args, policy, worker.envs[0], context)
        controller = subprocess.Popen(controller_command(args, policy_path, sim.period_s),
                                      env=dict(os.environ, ROS_DOMAIN_ID=str(domain)),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if args.controller == "lifecycle":
            drive_lifecycle(sim)
        sim.wait_for_controller()
        # the episodes start from a fresh env: the same ones her_mpi.evaluate runs
        worker.close()
        worker = RolloutWorker(env_config_from_training(policy.metadata.training_config), 1,
                               np.random.SeedSequence(args.seed))
        sim.env = worker.envs[0]
        successes = sim.run_episodes()
        sim.stand_still(1.2)  # one more diagnostics message with the final counts
        print(json.dumps(sim.report(successes)), flush=True)
        return 0
    except RuntimeError as exc:
        problem = controller.stderr.read()[-2000:] if controller is not None and controller.poll() is not None else ""
        print(f"her_mpi.ros_sim: error: {exc}\n{problem}", file=sys.stderr)
        return 1
    finally:
        if controller is not None and controller.poll() is None:
            controller.send_signal(signal.SIGINT)
            try:
                controller.wait(timeout=10)
            except subprocess.TimeoutExpired:
                controller.kill()
        if sim is not None:
            sim.executor.shutdown()
            sim.node.destroy_node()
        rclpy.shutdown(context=context)
        worker.close()


if __name__ == "__main__":
    sys.exit(main())
