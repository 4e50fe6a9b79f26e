"""``python -m her_mpi.export --checkpoint RUN/checkpoints/best.pt --output policy.onnx``

Writes one self-contained ONNX file: inputs ``observation`` [batch, obs_dim] (image policies:
[batch, channels, height, width], pixel values 0-255) and ``desired_goal`` [batch, goal_dim]
(float32, any batch size), output ``action`` [batch, action_dim] in the env's
units (float32), or the greedy action index [batch, 1] (int64) for discrete policies. The graph
is the policy module the agent acts with in training (clip, normalise, clip, network, scale), so
nothing has to be re-implemented on the robot. Metadata (algorithm, env, dims, bounds, control
period, training progress and the full training config) is stored in the file.

With ``--verify`` (the default) the file is checked with ``onnx.checker`` and onnxruntime must
match torch within 1e-5 plus four times torch's own float32 rounding error (its distance from a
float64 copy) on random inputs at batch sizes 1, 3 and 64, or the command fails.

``--card`` also writes the policy's card beside it (``policy.json``: task, algorithm, recipe,
training env steps, success on ``--card-episodes`` unseen episodes with its 95% interval, sha256,
size), as the trained policies in ``her_mpi_runtime/zoo`` carry.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from her_mpi import __version__
from her_mpi.checkpoint import atomic_write, load_checkpoint
from her_mpi.config import ConfigError

TOLERANCE = 1e-5
VERIFY_BATCH_SIZES = (1, 3, 64)


def metadata(state: dict) -> dict[str, str]:
    spec = state["spec"]
    return {
        "her_mpi_version": __version__,
        "algo": state["algo"],
        "env_id": spec["env_id"],
        "obs_dim": str(spec["obs_dim"]),
        "goal_dim": str(spec["goal_dim"]),
        "action_dim": str(spec["action_dim"]),
        "action_type": "discrete" if spec["discrete"] else "continuous",
        "n_actions": str(spec["n_actions"]),
        "action_low": json.dumps(list(spec["action_low"])),
        "action_high": json.dumps(list(spec["action_high"])),
        "control_period_s": repr(spec["control_period"]),
        "horizon": str(spec["horizon"]),
        "train_env_steps": str(state["env_steps"]),
        "train_epoch": str(state["epoch"] + 1),
        "train_n_ranks": str(state["n_ranks"]),
        "test_success_rate": repr(float(state["test_success_rate"])),
        "training_config": json.dumps(state["config"]),
    }


def export_policy(policy: torch.nn.Module, obs_dim: int, goal_dim: int, meta: dict[str, str]):
    """The ONNX ModelProto of ``policy`` with a dynamic batch dimension and ``meta`` attached."""
    policy = policy.eval()
    # A batch-1 example can freeze the batch dimension; export with several rows.
    example = (torch.randn(4, *observation_shape(policy, obs_dim)), torch.randn(4, goal_dim))
    batch = torch.export.Dim("batch")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" notes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exporter deprecation chatter, not about this model
        program = torch.onnx.export(policy, example, dynamo=True, external_data=False,
                                    input_names=["observation", "desired_goal"], output_names=["action"],
                                    dynamic_shapes={"observation": {0: batch}, "desired_goal": {0: batch}},
                                    verbose=False)
    model = program.model_proto
    for key, value in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    model.producer_name = "her_mpi"
    model.producer_version = __version__
    return model


def observation_shape(policy, obs_dim: int) -> tuple:
    """The observation input's shape after the batch: (obs_dim,), or an image's (C, H, W)."""
    return tuple(getattr(policy.inputs, "obs_shape", None) or (obs_dim,))


def random_inputs(policy, obs_dim: int, goal_dim: int, batch: int, rng: np.random.Generator):
    """Inputs spread like the training data (normaliser statistics), some beyond the clip range;
    images get random pixel values."""
    inputs = policy.inputs
    if hasattr(inputs, "obs_shape"):
        obs = rng.integers(0, 256, (batch, *inputs.obs_shape))
    else:
        obs = inputs.obs_normalizer.mean.numpy() + 3 * inputs.obs_normalizer.std.numpy() * rng.standard_normal((batch, obs_dim))
    goal = inputs.goal_normalizer.mean.numpy() + 3 * inputs.goal_normalizer.std.numpy() * rng.standard_normal((batch, goal_dim))
    return obs.astype(np.float32), goal.astype(np.float32)


def verify_inputs(policy, obs_dim: int, goal_dim: int):
    """(batch size, observations, goals) for each of the checks' batch sizes, the same on every call."""
    rng = np.random.default_rng(0)
    for batch in VERIFY_BATCH_SIZES:
        yield batch, *random_inputs(policy, obs_dim, goal_dim, batch, rng)


def verify(path: Path, policy, obs_dim: int, goal_dim: int) -> dict[int, float]:
    """onnx.checker, then onnxruntime vs torch; returns the max abs difference per batch size."""
    import onnx
    import onnxruntime as ort

    onnx.checker.check_model(str(path), full_check=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    differences = {}
    for batch, obs, goal in verify_inputs(policy, obs_dim, goal_dim):
        (onnx_action,) = session.run(["action"], {"observation": obs, "desired_goal": goal})
        with torch.inference_mode():
            torch_action = policy(torch.from_numpy(obs), torch.from_numpy(goal)).numpy()
        if onnx_action.shape != torch_action.shape:
            differences[batch] = float("inf")
        else:
            differences[batch] = float(np.abs(onnx_action.astype(np.float64) - torch_action).max())
    return differences


def float32_error(policy, obs_dim: int, goal_dim: int) -> float:
    """The policy's own float32 rounding: max |torch float32 - torch float64| on verify's inputs.
    Large, well-trained networks reach 1e-4; onnxruntime rounds differently, not worse."""
    if hasattr(policy.inputs, "obs_shape"):  # image policies cast pixels to float32 inside: no float64 copy
        return 0.0
    exact = copy.deepcopy(policy).double()
    error = 0.0
    for _, obs, goal in verify_inputs(policy, obs_dim, goal_dim):
        with torch.inference_mode():
            single = policy(torch.from_numpy(obs), torch.from_numpy(goal)).double()
            double = exact(torch.from_numpy(obs).double(), torch.from_numpy(goal).double())
        error = max(error, float((single - double).abs().max()))
    return error


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a success rate (sound at 0 and 1, unlike the normal one)."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def recipe_of(state: dict) -> str:
    """The recipe a checkpoint's run was started with, as far as its run directory says."""
    run_dir = Path(state["path"]).parent.parent
    sweep = run_dir / "sweep.json"
    if sweep.is_file():
        described = json.loads(sweep.read_text())
        return " ".join([described["recipe"], *(f"--set {o}" for o in described.get("overrides", []))])
    return "see the training config stored in the file"


def write_card(output: Path, state: dict, episodes: int, seed: int, recipe: str | None) -> dict:
    """Evaluate the exported file on ``episodes`` episodes of env seed ``seed`` (not a training
    seed's streams) and write its card, ``output`` with the suffix .json."""
    from her_mpi.evaluate import env_config_from_training
    from her_mpi.rollout import RolloutWorker
    from her_mpi_runtime import Policy

    policy = Policy(output)
    worker = RolloutWorker(env_config_from_training(state["config"]), min(10, episodes), np.random.SeedSequence(seed))
    try:
        success = worker.generate(policy.act, episodes, env_units=True).success
    finally:
        worker.close()
    wins = int(success.sum())
    algo = state["algo"] + ("+kfac" if state["config"]["algo"].get("optimizer") == "kfac" else "")
    data = output.read_bytes()
    card = {
        "name": output.stem, "env_id": state["spec"]["env_id"], "algorithm": algo,
        "recipe": recipe or recipe_of(state), "train_seed": state["config"]["train"]["seed"],
        "train_env_steps": int(state["env_steps"]), "train_n_ranks": int(state["n_ranks"]),
        "success_rate": wins / episodes, "success_interval_95": list(wilson_interval(wins, episodes)),
        "evaluation": f"python -m her_mpi.evaluate --policy zoo:{output.stem} --episodes {episodes} --seed {seed}",
        "episodes": episodes, "evaluation_seed": seed,
        "sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data), "her_mpi_version": __version__,
        "exported": time.strftime("%Y-%m-%d"),
    }
    atomic_write(output.with_suffix(".json"), lambda f: f.write(json.dumps(card, indent=1) + "\n"), mode="w")
    return card


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m her_mpi.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a checkpoint file or a run directory")
    parser.add_argument("--output", required=True, help="the .onnx file to write")
    parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                        help="check the file and compare onnxruntime with torch (default: on)")
    parser.add_argument("--card", action="store_true",
                        help="evaluate the file on unseen episodes and write its card (OUTPUT with .json)")
    parser.add_argument("--card-episodes", type=int, default=300, help="episodes the card's success is measured on")
    parser.add_argument("--card-seed", type=int, default=1000,
                        help="their env seed (default 1000: no training run's seed, so the episodes are unseen)")
    parser.add_argument("--recipe", help="how the policy was trained, for the card (default: from the run directory)")
    args = parser.parse_args(argv)
    problems = [f"--card-episodes {args.card_episodes}: expected an integer >= 1"] if args.card_episodes < 1 else []
    if args.card_seed < 0:
        problems.append(f"--card-seed {args.card_seed}: expected an integer >= 0 (a numpy SeedSequence entropy)")
    if Path(args.output).is_dir():
        problems.append(f"--output {args.output!r} is a directory: expected the .onnx file to write")
    if problems:
        print(f"her_mpi.export: error: {'; '.join(problems)}", file=sys.stderr)
        return 2

    try:
        state = load_checkpoint(args.checkpoint)
    except ConfigError as exc:
        print(f"her_mpi.export: error: {exc}", file=sys.stderr)
        return 2
    from her_mpi.trainer import agent_from_checkpoint  # after the cheap checks

    torch.set_num_threads(1)
    agent = agent_from_checkpoint(state)
    policy = agent.policy().eval()
    spec = state["spec"]
    model = export_policy(policy, spec["obs_dim"], spec["goal_dim"], metadata(state))
    output = Path(args.output)
    atomic_write(output, lambda f: f.write(model.SerializeToString()))
    print(f"wrote {output} ({output.stat().st_size / 1024:.0f} KiB): {state['algo']} on {spec['env_id']}, "
          f"epoch {state['epoch'] + 1}, test success {state['test_success_rate']:.3f}")
    if not args.verify and not args.card:
        return 0
    differences = verify(output, policy, spec["obs_dim"], spec["goal_dim"])
    report = ", ".join(f"batch {b}: {d:.2e}" for b, d in differences.items())
    # Two float32 computations of the same function may each be off the exact one by the network's
    # own rounding error; an export bug is orders of magnitude larger.
    rounding = float32_error(policy, spec["obs_dim"], spec["goal_dim"])
    tolerance = TOLERANCE + 4 * rounding
    explained = f"tolerance {tolerance:.2e}: {TOLERANCE:g} + 4 x torch's own float32 error {rounding:.2e}"
    if max(differences.values()) > tolerance:
        print(f"her_mpi.export: verification FAILED: max |onnxruntime - torch| {report} ({explained})",
              file=sys.stderr)
        return 1
    print(f"verified: onnx.checker passed; max |onnxruntime - torch| {report} ({explained})")
    if args.card:
        card = write_card(output, state, args.card_episodes, args.card_seed, args.recipe)
        low, high = card["success_interval_95"]
        print(f"card {output.with_suffix('.json')}: success {card['success_rate']:.3f} [{low:.3f}, {high:.3f}] "
              f"on {args.card_episodes} episodes of env seed {args.card_seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
