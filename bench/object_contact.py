"""Does a Fetch manipulation policy touch the object? A diagnostic for runs that have not taken off.

    python bench/object_contact.py RUN_DIR_OR_CHECKPOINT [...] [--episodes 40] [--seed 1000] [--name NAME]

Before FetchPush's success rate rises, test success only counts the episodes whose object starts
at its goal, so curves of different recipes look alike. This runs each policy's deterministic
actions on the same episodes and prints, per checkpoint, what it does with the object: the share of
episodes in which the object moved more than 2 cm, its mean displacement, the median closest
gripper-object distance, and the object's distance to the goal at the start and at the end.
With ``--name`` the rows are also saved to bench/results/NAME.json.
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import numpy as np

from common import save

from her_mpi.envs import make_env
from her_mpi.evaluate import load_policy
from her_mpi.settings import EnvConfig


def contact(checkpoint: str, n_episodes: int, seed: int) -> dict:
    act, config, source, _ = load_policy(SimpleNamespace(checkpoint=checkpoint, policy=None))
    env_id = config["env"]["id"]
    env = make_env(EnvConfig(env_id, config["env"].get("kwargs", {})), seed)
    moved, closest, start, end, success = [], [], [], [], []
    for episode in range(n_episodes):
        o, _ = env.reset(seed=seed + episode)
        object_start, nearest = o["achieved_goal"].copy(), np.inf
        for _ in range(env.spec.max_episode_steps or 50):
            o, _, terminated, truncated, info = env.step(act(o["observation"][None].astype(np.float32),
                                                             o["desired_goal"][None].astype(np.float32))[0])
            nearest = min(nearest, float(np.linalg.norm(o["observation"][:3] - o["observation"][3:6])))
            if terminated or truncated:
                break
        moved.append(float(np.linalg.norm(o["achieved_goal"] - object_start)))
        closest.append(nearest)
        start.append(float(np.linalg.norm(object_start - o["desired_goal"])))
        end.append(float(np.linalg.norm(o["achieved_goal"] - o["desired_goal"])))
        success.append(float(info.get("is_success", 0.0)))
    env.close()
    return {"policy": source, "env": env_id, "episodes": n_episodes, "success": float(np.mean(success)),
            "object_moved_2cm": float(np.mean(np.array(moved) > 0.02)), "mean_displacement_m": float(np.mean(moved)),
            "median_closest_gripper_object_m": float(np.median(closest)),
            "goal_distance_start_m": float(np.mean(start)), "goal_distance_end_m": float(np.mean(end))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", help="run directories or checkpoint files of Fetch object tasks")
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1000, help="episode e resets with seed + e")
    parser.add_argument("--name", help="also save the rows to bench/results/NAME.json")
    args = parser.parse_args()
    rows = []
    for checkpoint in args.checkpoints:
        rows.append({k: round(v, 3) if isinstance(v, float) else v
                     for k, v in contact(checkpoint, args.episodes, args.seed).items()})
        print(json.dumps(rows[-1]), flush=True)
    if args.name:
        save(args.name, {"episodes": args.episodes, "seed": args.seed, "policies": rows})


if __name__ == "__main__":
    main()
