"""``python -m her_mpi.evaluate --policy policy.onnx --episodes 100`` (or ``--checkpoint``)

Runs the deterministic policy in simulation and prints JSON with the success rate (the env's
``is_success`` at the last step), the reached rate (the goal reached after any step: above the
success rate, the policy reaches goals and leaves them) and the mean return. The env and its
parameters come from the policy's training config; ``--env`` overrides the id. The same ``--seed`` gives the same episodes,
so an exported policy and its checkpoint can be compared directly.

``--video out.mp4`` (or ``.gif``) renders the episodes offscreen instead (5 unless ``--episodes``
says otherwise) with the goal marked and each episode's result written on its frames; the JSON
then describes those episodes and the file. Without a display MuJoCo's EGL backend is chosen
(``MUJOCO_GL=egl``) unless ``MUJOCO_GL`` is set.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from her_mpi.config import ConfigError, EnvConfig
from her_mpi.envs import compute_success
from her_mpi.video import (EpisodeSummary, RenderEnv, check_encoder, check_frame_size, episode_frames,
                           natural_fps, select_gl_backend, video_format, write_video)


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


def env_config_from_training(training_config: dict, env_id: str | None = None, **kwargs) -> EnvConfig:
    """The env a policy was trained on (from its run's config), optionally another id or extra env kwargs."""
    section = training_config.get("env", {})
    return EnvConfig(id=env_id or section.get("id", ""), kwargs={**section.get("kwargs", {}), **kwargs},
                     max_episode_steps=section.get("max_episode_steps"))


def at_goal_steps(episodes, success_fn) -> np.ndarray:
    """[episodes, steps]: whether the achieved goal is at the goal after each step (False past an
    episode's end)."""
    n, T = episodes.actions.shape[:2]
    at_goal = success_fn(episodes.ag[:, 1:].reshape(n * T, -1), episodes.g[:, 1:].reshape(n * T, -1)).reshape(n, T)
    return (at_goal > 0) & (np.arange(T)[None, :] < episodes.lengths[:, None])


def reached_goal(episodes, success_fn) -> np.ndarray:
    """Per episode, whether its achieved goal reached the goal after some step. Success judges
    the last step (Fetch, Hand): a policy that reaches the goal and leaves it fails there."""
    return at_goal_steps(episodes, success_fn).any(axis=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m her_mpi.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--policy", help="an .onnx file written by python -m her_mpi.export")
    source.add_argument("--checkpoint", help="a training checkpoint (or run directory)")
    parser.add_argument("--episodes", type=int, help="episodes to run (default: 100, or 5 with --video)")
    parser.add_argument("--env", help="env id (default: the one the policy was trained on)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parallel-envs", type=int, default=10, help="envs stepped together (batched policy calls)")
    video = parser.add_argument_group("video (offscreen rendering)")
    video.add_argument("--video", metavar="FILE", help="render the episodes into FILE (.mp4 or .gif)")
    video.add_argument("--fps", type=float, help="frames per second (default: real time, 1/control period; 4 for envs without one)")
    video.add_argument("--width", type=int, default=480, help="frame width in pixels (default 480)")
    video.add_argument("--height", type=int, default=480, help="frame height in pixels (default 480)")
    args = parser.parse_args(argv)
    try:
        if args.episodes is None:
            args.episodes = 5 if args.video else 100
        if args.episodes < 1:
            raise ConfigError(f"--episodes must be >= 1, got {args.episodes}")
        if args.seed < 0:
            raise ConfigError(f"--seed must be >= 0 (a numpy SeedSequence entropy), got {args.seed}")
        if args.parallel_envs < 1:
            raise ConfigError(f"--parallel-envs must be >= 1, got {args.parallel_envs}")
        if args.video:
            fmt = video_format(args.video)  # every check that needs no rendering, before any
            check_frame_size(args.width, args.height, fmt, "--width/--height")
            check_encoder(fmt)
            if args.fps is not None and not 0 < args.fps <= 1000:
                raise ConfigError(f"--fps must be in (0, 1000], got {args.fps}")
            backend = select_gl_backend()  # before mujoco is imported
        act, training_config, description, dims = load_policy(args)
        env_cfg = env_config_from_training(training_config, env_id=args.env)
        if args.video:
            worker = RenderEnv(env_cfg, args.width, args.height, backend)
        else:
            from her_mpi.rollout import RolloutWorker

            worker = RolloutWorker(env_cfg, min(args.parallel_envs, args.episodes), np.random.SeedSequence(args.seed))
        if (worker.spec.obs_dim, worker.spec.goal_dim) != dims:
            raise ConfigError(f"--env {env_cfg.id} has observations of size {worker.spec.obs_dim} and goals of "
                              f"size {worker.spec.goal_dim}, but the policy expects {dims[0]} and {dims[1]}")
    except ConfigError as exc:
        print(f"her_mpi.evaluate: error: {exc}", file=sys.stderr)
        return 2
    if args.video:
        return render_video(args, worker, act, description, env_cfg.id)
    try:
        episodes = worker.generate(act, args.episodes, env_units=True)
        reached = reached_goal(episodes, lambda ag, g: compute_success(worker.envs[0], ag, g))
    finally:
        worker.close()
    print(json.dumps({
        "policy": description, "env_id": env_cfg.id, "episodes": args.episodes, "seed": args.seed,
        "success_rate": float(episodes.success.mean()),
        "reached_rate": float(reached.mean()),
        "mean_return": float(episodes.rewards.sum(axis=1).mean()),
        "mean_length": float(episodes.lengths.mean()),
    }))
    return 0


def render_video(args, render_env: RenderEnv, act, description: str, env_id: str) -> int:
    fps = args.fps or natural_fps(render_env.spec)
    summaries: list[EpisodeSummary] = []
    try:
        frames = write_video(args.video, episode_frames(render_env, act, args.episodes, args.seed, summaries), fps)
    except ConfigError as exc:
        print(f"her_mpi.evaluate: error: {exc}", file=sys.stderr)
        return 2
    finally:
        render_env.close()
    print(json.dumps({
        "policy": description, "env_id": env_id, "episodes": args.episodes, "seed": args.seed,
        "success_rate": float(np.mean([s.success for s in summaries])),
        "mean_return": float(np.mean([s.episode_return for s in summaries])),
        "mean_length": float(np.mean([s.length for s in summaries])),
        "video": str(args.video), "frames": frames, "width": args.width, "height": args.height, "fps": fps,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
