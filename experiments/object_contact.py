"""Does a Fetch manipulation policy touch the object? A diagnostic for runs that have not taken off.

    python experiments/object_contact.py RUN_DIR_OR_CHECKPOINT [...] [--episodes 40] [--seed 1000] [--name NAME]
                                         [--label LABEL ...] [--append]

Before FetchPush's success rate rises, test success only counts the episodes whose object starts
at its goal, so curves of different recipes look alike. This runs each policy's deterministic
actions on the same episodes and prints, per checkpoint, what it does with the object: the share of
episodes in which the object moved more than 2 cm, its mean displacement, the median closest
gripper-object distance, the object's distance to the goal at the start and at the end, and
whether a moved object goes towards its goal (mean cosine of its displacement with the direction
to the goal on the table: 1 towards, 0 unrelated, -1 away), and for the failed episodes the median
distance from the goal at the end and the share that ended beyond the goal rather than short of it.
For the episodes whose object reaches its goal at some step it says what happens there: how many are
still at the goal at the last step (which Fetch scores), how fast the object moves when it first
arrives, how far it goes in the next three steps, and (continuous actions) how hard the gripper
still pushes then: a policy that arrives fast and keeps pushing overshoots.
For tasks with goals in the air (PickAndPlace) it splits success by where the goal is and says how
often the object was lifted when it had to be: a policy that fails the air goals without lifting
lacks the grasp, one that lifts and still fails lacks the placing. A policy is a run directory, a
checkpoint, an exported .onnx file or ``zoo:NAME``; ``--input-clip K`` runs exported policies with
their normalised inputs clipped at K std instead of the trained clip (no retraining): if widening the
clip alone mends failures, the trained clip was hiding inputs the policy needed.
With ``--name`` the rows are also saved to experiments/results/NAME.json; ``--label`` names each policy's
row (one per policy, e.g. "seed 0 at 1.3M env steps") instead of its path, and ``--append`` adds the rows
to an existing NAME.json measured on the same episodes and CPU model, so a run's checkpoints taken at
different times (one path, overwritten as it trains) land in one file.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from common import RESULTS, machine, save

from her_mpi.envs import compute_success
from her_mpi.evaluate import at_goal_steps, load_policy
from her_mpi.rollout import RolloutWorker
from her_mpi.settings import EnvConfig


def widen_input_clip(policy: str, clip: float, directory: str) -> str:
    """A copy of an exported policy whose clip after normalising (the Clip fed by the Div) is ±clip."""
    import onnx
    from onnx import numpy_helper

    from her_mpi_runtime.policy import resolve

    model = onnx.load(str(resolve(policy)))
    producers = {out: node for node in model.graph.node for out in node.output}
    bounds = [name for node in model.graph.node if node.op_type == "Clip" and producers[node.input[0]].op_type == "Div"
              for name in node.input[1:]]
    if len(bounds) != 2:
        raise SystemExit(f"{policy}: expected one normalised-input Clip, found {len(bounds) // 2}")
    for tensor in model.graph.initializer:
        if tensor.name in bounds:
            sign = np.sign(numpy_helper.to_array(tensor))
            tensor.CopyFrom(numpy_helper.from_array(np.asarray(sign * clip, np.float32), tensor.name))
    path = Path(directory) / f"clip{clip:g}.onnx"
    onnx.save(model, str(path))
    return str(path)


def contact(policy: str, n_episodes: int, seed: int, input_clip: float | None = None,
            label: str | None = None) -> dict:
    """What the policy does with the object; the row is named ``label``, or the policy's path by default."""
    exported = policy.endswith(".onnx") or policy.startswith("zoo:")
    if input_clip is not None:
        if not exported:
            raise SystemExit(f"--input-clip needs an exported policy (.onnx or zoo:NAME), got {policy!r}")
        with tempfile.TemporaryDirectory() as directory:
            row = contact(widen_input_clip(policy, input_clip, directory), n_episodes, seed)
        return {**row, "policy": f"{label or policy} with inputs clipped at {input_clip:g} std"}
    act, config, source, _ = load_policy(SimpleNamespace(checkpoint=None if exported else policy,
                                                         policy=policy if exported else None))
    env = config["env"]
    worker = RolloutWorker(EnvConfig(env["id"], env.get("kwargs", {}), env.get("max_episode_steps")),
                           min(10, n_episodes), np.random.SeedSequence(seed))
    try:  # the same seed gives every checkpoint the same episodes
        episodes = worker.generate(act, n_episodes, env_units=True)
        at_goal = at_goal_steps(episodes, lambda ag, g: compute_success(worker.envs[0], ag, g))
    finally:
        worker.close()
    # Fetch observations start with the gripper's position, then the object's; arrays past an
    # episode's end repeat its last entry, so [:, -1] is where it ended
    gripper, thing = episodes.obs[:, 1:, :3], episodes.obs[:, 1:, 3:6]
    moved = np.linalg.norm(episodes.ag[:, -1] - episodes.ag[:, 0], axis=-1)
    goal = episodes.g[:, -1]
    # goal-directedness: does a moved object go towards its goal (cosine of its displacement with
    # the start-to-goal direction, on the table's plane: 1 towards, 0 unrelated, -1 away)
    displacement, wanted = episodes.ag[:, -1, :2] - episodes.ag[:, 0, :2], goal[:, :2] - episodes.ag[:, 0, :2]
    cosine = np.sum(displacement * wanted, axis=-1) / np.maximum(
        np.linalg.norm(displacement, axis=-1) * np.linalg.norm(wanted, axis=-1), 1e-9)
    # a failure's range error: how far the object ended from its goal, and whether beyond it (along the
    # start-to-goal direction on the table) or short of it
    end_distance = np.linalg.norm(episodes.ag[:, -1] - goal, axis=-1)
    along = np.sum((episodes.ag[:, -1, :2] - goal[:, :2]) * wanted, axis=-1) / np.maximum(
        np.linalg.norm(wanted, axis=-1), 1e-9)
    failed = ~episodes.success.astype(bool)
    # goals more than 2 cm above the object's start are in the air: reachable only by lifting it
    height, rise = goal[:, 2] - episodes.ag[:, 0, 2], episodes.ag[:, :, 2] - episodes.ag[:, :1, 2]
    in_air, lifted = height > 0.02, rise.max(axis=1) > 0.02
    by_goal_height = {} if not in_air.any() else {
        "goal_in_air_share": float(np.mean(in_air)),
        "success_goal_in_air": float(np.mean(~failed[in_air])),
        "success_goal_on_table": float(np.mean(~failed[~in_air])) if (~in_air).any() else None,
        "lifted_when_goal_in_air": float(np.mean(lifted[in_air])),
        "failed_in_air_lifted_share": float(np.mean(lifted[in_air & failed])) if (in_air & failed).any() else None,
        # per 10 cm of goal height above the object's start: [episodes, success, median end height]
        "by_goal_height_m": {f"{low:.1f}-{low + 0.1:.1f}": [int(band.sum()), round(float(np.mean(~failed[band])), 3),
                                                              round(float(np.median(rise[band, -1])), 3)]
                             for low in np.arange(0.0, 0.5, 0.1)
                             for band in [in_air & (height >= low) & (height < low + 0.1)] if band.any()}}
    return {"policy": label or source, "env": env["id"], "episodes": n_episodes,
            "success": float(episodes.success.mean()),
            "object_moved_2cm": float(np.mean(moved > 0.02)), "mean_displacement_m": float(np.mean(moved)),
            "median_closest_gripper_object_m": float(np.median(np.linalg.norm(gripper - thing, axis=-1).min(axis=1))),
            "goal_distance_start_m": float(np.mean(np.linalg.norm(episodes.ag[:, 0] - goal, axis=-1))),
            "goal_distance_end_m": float(np.mean(end_distance)),
            "push_towards_goal_cos": float(np.mean(cosine[moved > 0.02])) if np.any(moved > 0.02) else None,
            "failed_goal_distance_median_m": float(np.median(end_distance[failed])) if failed.any() else None,
            "failed_beyond_goal_share": float(np.mean(along[failed] > 0)) if failed.any() else None,
            **by_goal_height, **after_arrival(episodes, at_goal)}


def after_arrival(episodes, at_goal: np.ndarray) -> dict:
    """What the episodes that reach their goal at some step do there (``at_goal``: [n, T] after each step)."""
    reached = at_goal.any(axis=1)
    if not reached.any():
        return {"reached_share": 0.0}
    rows = np.flatnonzero(reached)
    arrive = at_goal[rows].argmax(axis=1) + 1  # index into ag/obs: the state after the first successful step
    last = episodes.ag.shape[1] - 1
    ag = episodes.ag[rows]
    each = np.arange(len(rows))
    at = ag[each, arrive]  # where the object is on arriving
    speed = np.linalg.norm(at - ag[each, arrive - 1], axis=-1)
    travel = np.linalg.norm(ag[each, np.minimum(arrive + 3, last)] - at, axis=-1)
    held = episodes.success[rows].astype(bool)
    row = {"reached_share": float(reached.mean()), "held_share_of_reached": float(held.mean()),
           "first_arrival_step_median": float(np.median(arrive)),
           "arrival_speed_cm_per_step_median": float(100 * np.median(speed)),
           "travel_3_steps_after_arrival_cm_median": float(100 * np.median(travel)),
           "steps_at_goal_median_not_held": float(np.median(at_goal[rows][~held].sum(axis=1))) if (~held).any() else None}
    if np.issubdtype(episodes.actions.dtype, np.floating):  # continuous: the table-plane push after arriving
        after = np.arange(episodes.actions.shape[1])[None, :] >= arrive[:, None]  # actions taken at the goal
        push = np.linalg.norm(episodes.actions[rows, :, :2], axis=-1)
        row["action_xy_norm_after_arrival_mean"] = float(push[after].mean())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", help="run directories, checkpoint files, .onnx files or zoo:NAME of Fetch object tasks")
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1000, help="seed of the episodes (the same for every checkpoint)")
    parser.add_argument("--input-clip", type=float, help="also run exported policies with normalised inputs "
                        "clipped at this many std (no retraining)")
    parser.add_argument("--name", help="also save the rows to experiments/results/NAME.json")
    parser.add_argument("--label", action="append",
                        help="the row's name for each policy, in order (default: its path)")
    parser.add_argument("--append", action="store_true", help="add the rows to the existing NAME.json")
    args = parser.parse_args()
    labels = args.label or [None] * len(args.checkpoints)
    if len(labels) != len(args.checkpoints):
        parser.error(f"--label given {len(labels)} times for {len(args.checkpoints)} policies: give one per policy")
    earlier = earlier_rows(args.name, args.episodes, args.seed) if args.append else []
    rows = []
    for policy, label in zip(args.checkpoints, labels):
        for input_clip in [None] + ([args.input_clip] if args.input_clip is not None else []):
            row = contact(policy, args.episodes, args.seed, input_clip, label)
            rows.append({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
            print(json.dumps(rows[-1]), flush=True)
    if args.name:
        save(args.name, {"episodes": args.episodes, "seed": args.seed, "policies": earlier + rows})


def earlier_rows(name: str | None, n_episodes: int, seed: int) -> list[dict]:
    """The rows of an existing results file that new rows may join: same episodes, same CPU model."""
    if not name:
        raise SystemExit("--append needs --name NAME: the results file to add the rows to")
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"--append: {path} does not exist; run without --append to create it")
    result = json.loads(path.read_text())
    if (result["episodes"], result["seed"]) != (n_episodes, seed):
        raise SystemExit(f"--append: {path} holds {result['episodes']} episodes from seed {result['seed']}, "
                         f"not {n_episodes} from seed {seed}: rows on other episodes do not compare")
    here, there = machine(), result["machine"]
    if (here["cpu"], here["cpu_kernels"]) != (there["cpu"], there["cpu_kernels"]):
        raise SystemExit(f"--append: {path} was measured on {there['cpu']} ({there['cpu_kernels']}), this is "
                         f"{here['cpu']} ({here['cpu_kernels']}): save these rows under a new --name")
    return result["policies"]


if __name__ == "__main__":
    main()
