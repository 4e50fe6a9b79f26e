"""Batch-1 inference latency of an exported policy: onnxruntime (her_mpi_runtime) vs the torch
actor, and end-to-end latency of the ROS 2 controller node (observation message in -> action
message out, node in its own process, trigger=observation).

    python bench/inference_latency.py --policy policy.onnx --checkpoint RUN/checkpoints/best.pt

Targets on the reference machine: runtime p50 <= 20 us, p99 <= 100 us.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time

import numpy as np

from common import save


def percentiles(samples_s: list[float]) -> dict:
    us = np.asarray(samples_s) * 1e6
    return {"p50_us": round(float(np.percentile(us, 50)), 1), "p90_us": round(float(np.percentile(us, 90)), 1),
            "p99_us": round(float(np.percentile(us, 99)), 1), "mean_us": round(float(us.mean()), 1), "n": len(us)}


def time_calls(fn, n: int, warmup: int = 200) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def runtime_latency(path: str, n: int, blocks: int = 20) -> dict:
    """Policy.act against a bare session.run on the same file, in alternating blocks of calls (so a
    background load slows both alike); the overhead is the ratio of their medians."""
    from her_mpi_runtime import Policy

    policy = Policy(path)
    meta = policy.metadata
    rng = np.random.default_rng(0)
    obs, goal = rng.normal(size=meta.obs_dim).astype(np.float32), rng.normal(size=meta.goal_dim).astype(np.float32)
    feeds = {"observation": obs[None], "desired_goal": goal[None]}
    act, bare = [], []
    for _ in range(blocks):
        act += time_calls(lambda: policy.act(obs, goal), n // blocks)
        bare += time_calls(lambda: policy.session.run(["action"], feeds), n // blocks)
    result = {"runtime_act": percentiles(act), "onnxruntime_session_run": percentiles(bare)}
    result["act_over_session_run_p50"] = round(result["runtime_act"]["p50_us"] / result["onnxruntime_session_run"]["p50_us"], 3)
    return result


def torch_latency(checkpoint: str, n: int) -> dict:
    import torch

    from her_mpi.checkpoint import load_checkpoint
    from her_mpi.trainer import agent_from_checkpoint

    torch.set_num_threads(1)
    state = load_checkpoint(checkpoint)
    module = agent_from_checkpoint(state).policy().eval()
    spec = state["spec"]
    obs, goal = torch.randn(1, spec["obs_dim"]), torch.randn(1, spec["goal_dim"])

    def call():
        with torch.inference_mode():
            module(obs, goal)

    return {"torch_policy": percentiles(time_calls(call, n))}


def ros_latency(path: str, n: int) -> dict:
    """Round trip publish(observation) -> receive(action) with the node in another process."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from std_msgs.msg import Float64MultiArray

    from her_mpi_runtime import Policy

    meta = Policy(path).metadata
    domain = random.randint(100, 200)
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain))
    node = subprocess.Popen([sys.executable, "-m", "her_mpi_runtime.ros_node", "--ros-args", "-p", f"model_path:={path}",
                             "-p", "trigger:=observation", "-p", "rate_hz:=1.0", "-p", "input_timeout_s:=1000.0"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    tester = rclpy.create_node("latency_probe", context=context)
    received = []
    tester.create_subscription(Float64MultiArray, "action", lambda m: received.append(time.perf_counter()), 10)
    obs_pub = tester.create_publisher(Float64MultiArray, "observation", 10)
    goal_pub = tester.create_publisher(Float64MultiArray, "desired_goal", 10)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(tester)
    obs = Float64MultiArray(data=[0.1] * meta.obs_dim)
    goal = Float64MultiArray(data=[0.2] * meta.goal_dim)
    deadline = time.time() + 30
    while not received and time.time() < deadline:  # wait for discovery and the first action
        goal_pub.publish(goal)
        obs_pub.publish(obs)
        executor.spin_once(timeout_sec=0.05)
    samples = []
    for i in range(n + 50):
        received.clear()
        sent = time.perf_counter()
        obs_pub.publish(obs)
        while not received and time.perf_counter() - sent < 1.0:
            executor.spin_once(timeout_sec=0.001)
        if received and i >= 50:
            samples.append(received[0] - sent)
    node.terminate()
    node.wait(timeout=10)
    rclpy.shutdown(context=context)
    return {"ros_node_round_trip": percentiles(samples)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("-n", type=int, default=20000)
    parser.add_argument("--ros-messages", type=int, default=1000)
    parser.add_argument("--name", default="inference_latency")
    args = parser.parse_args()

    result = {"policy": args.policy, "targets": {"runtime_p50_us": 20, "runtime_p99_us": 100}}
    result.update(runtime_latency(args.policy, args.n))
    result.update(torch_latency(args.checkpoint, args.n // 4))
    result.update(ros_latency(args.policy, args.ros_messages))
    save(args.name, result)


if __name__ == "__main__":
    main()
