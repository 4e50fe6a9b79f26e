"""``python -m her_mpi.evaluate --policy policy.onnx --episodes 100`` (or ``--checkpoint``)

Runs the deterministic policy in simulation and prints JSON with the success rate (the env's
``is_success`` at the last step) and the mean return. The env and its parameters come from the
policy's training config; ``--env`` overrides the id. The same ``--seed`` gives the same episodes,
so an exported policy and its checkpoint can be compared directly.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from her_mpi.config import ConfigError, EnvConfig


def load_policy(args) -> tuple[callable, dict, str, tuple[int, int]]:
    """(env-units policy function, training config dict, description, (obs_dim, goal_dim))."""
    if args.policy:
        from her_mpi_runtime import Policy

        try:
            policy = Policy(args.policy)
        except (FileNotFoundError, ValueError) as exc:
            raise ConfigError(str(exc)) from None
        meta = policy.metadata
        return policy.act, meta.training_config, f"onnx:{args.policy}", (meta.obs_dim, meta.goal_dim)
    import torch

    from her_mpi.checkpoint import load_checkpoint
    from her_mpi.trainer import agent_from_checkpoint

    torch.set_num_threads(1)
    state = load_checkpoint(args.checkpoint)
    module = agent_from_checkpoint(state).policy().eval()

    def act(obs, goal):
        with torch.inference_mode():
            return module(torch.from_numpy(obs), torch.from_numpy(goal)).numpy()

    spec = state["spec"]
    return act, state["config"], f"checkpoint:{state['path']}", (spec["obs_dim"], spec["goal_dim"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m her_mpi.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--policy", help="an .onnx file written by python -m her_mpi.export")
    source.add_argument("--checkpoint", help="a training checkpoint (or run directory)")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--env", help="env id (default: the one the policy was trained on)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parallel-envs", type=int, default=10, help="envs stepped together (batched policy calls)")
    args = parser.parse_args(argv)
    try:
        if args.episodes < 1:
            raise ConfigError(f"--episodes must be >= 1, got {args.episodes}")
        act, training_config, description, dims = load_policy(args)
        env_section = dict(training_config.get("env", {}))
        env_cfg = EnvConfig(id=args.env or env_section.get("id", ""), kwargs=env_section.get("kwargs", {}),
                            max_episode_steps=env_section.get("max_episode_steps"))
        from her_mpi.rollout import RolloutWorker

        worker = RolloutWorker(env_cfg, min(args.parallel_envs, args.episodes), np.random.SeedSequence(args.seed))
        if (worker.spec.obs_dim, worker.spec.goal_dim) != dims:
            raise ConfigError(f"--env {env_cfg.id} has observations of size {worker.spec.obs_dim} and goals of "
                              f"size {worker.spec.goal_dim}, but the policy expects {dims[0]} and {dims[1]}")
    except ConfigError as exc:
        print(f"her_mpi.evaluate: error: {exc}", file=sys.stderr)
        return 2
    episodes = worker.generate(act, args.episodes, env_units=True)
    print(json.dumps({
        "policy": description, "env_id": env_cfg.id, "episodes": args.episodes, "seed": args.seed,
        "success_rate": float(episodes.success.mean()),
        "mean_return": float(episodes.rewards.sum(axis=1).mean()),
        "mean_length": float(episodes.lengths.mean()),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
