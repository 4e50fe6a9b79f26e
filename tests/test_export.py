"""ONNX export, the torch-free runtime and simulation evaluation, on policies trained for real."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

from helpers import TINY, describe, run_python

ALGOS = ["ddpg", "sac"]


def test_discrete_policy_exports_the_greedy_action(tmp_path):
    run_dir, path = tmp_path / "run", tmp_path / "dqn.onnx"
    result = run_python(["-m", "her_mpi.train", "--config", "configs/bitflip_10_dqn.yaml", "--run-dir", run_dir,
                         "--set", "train.n_epochs=1", *TINY])
    assert result.returncode == 0, describe(result)
    result = run_python(["-m", "her_mpi.export", "--checkpoint", run_dir, "--output", path])
    assert result.returncode == 0 and "verified" in result.stdout, describe(result)
    from her_mpi_runtime import Policy

    policy, module = Policy(path), torch_policy(run_dir / "checkpoints" / "latest.pt")
    assert policy.metadata.discrete and policy.metadata.n_actions == 10 and policy.metadata.action_dim == 1
    bits = np.random.default_rng(0).integers(0, 2, (64, 10)).astype(np.float32)
    goals = np.random.default_rng(1).integers(0, 2, (64, 10)).astype(np.float32)
    action = policy.act(bits, goals)
    assert action.dtype == np.int64 and action.shape == (64, 1) and np.all((0 <= action) & (action < 10))
    with torch.inference_mode():
        np.testing.assert_array_equal(action, module(torch.from_numpy(bits), torch.from_numpy(goals)).numpy())
    for i in range(3):  # the bound batch-1 path gives each input its own action
        single = policy.act(bits[i], goals[i])
        assert single.dtype == np.int64 and single.shape == (1,) and single[0] == action[i, 0]
    result = run_python(["-m", "her_mpi.evaluate", "--policy", path, "--episodes", "10"])
    assert result.returncode == 0 and '"env_id": "BitFlipping-v0"' in result.stdout, describe(result)


def test_layer_norm_policy_exports_and_runs_like_torch(tmp_path):
    run_dir, path = tmp_path / "run", tmp_path / "td3_layer_norm.onnx"
    result = run_python(["-m", "her_mpi.train", "--run-dir", run_dir, "--set", "algo=td3", "--set", "algo.layer_norm=true",
                         "--set", "train.n_epochs=1", *TINY])
    assert result.returncode == 0, describe(result)
    result = run_python(["-m", "her_mpi.export", "--checkpoint", run_dir, "--output", path])
    assert result.returncode == 0 and "verified" in result.stdout, describe(result)
    assert "LayerNormalization" in {node.op_type for node in onnx.load(path).graph.node}
    from her_mpi_runtime import Policy

    policy, module = Policy(path), torch_policy(run_dir / "checkpoints" / "latest.pt")
    rng = np.random.default_rng(0)
    obs, goals = rng.normal(size=(32, 10)).astype(np.float32), rng.normal(size=(32, 3)).astype(np.float32)
    with torch.inference_mode():
        expected = module(torch.from_numpy(obs), torch.from_numpy(goals)).numpy()
    np.testing.assert_allclose(policy.act(obs, goals), expected, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module", params=ALGOS)
def exported(request, tmp_path_factory):
    """A briefly trained policy of each algorithm, exported to ONNX."""
    algo = request.param
    root = tmp_path_factory.mktemp(algo)
    run_dir, onnx_path = root / "run", root / "policy.onnx"
    result = run_python(["-m", "her_mpi.train", "--run-dir", run_dir, "--set", f"algo={algo}",
                         "--set", "train.n_epochs=1", *TINY])
    assert result.returncode == 0, describe(result)
    checkpoint = run_dir / "checkpoints" / "best.pt"
    result = run_python(["-m", "her_mpi.export", "--checkpoint", checkpoint, "--output", onnx_path])
    assert result.returncode == 0, describe(result)
    return {"algo": algo, "checkpoint": checkpoint, "onnx": onnx_path, "stdout": result.stdout, "root": root}


def torch_policy(checkpoint):
    from her_mpi.checkpoint import load_checkpoint
    from her_mpi.trainer import agent_from_checkpoint

    return agent_from_checkpoint(load_checkpoint(checkpoint)).policy().eval()


def test_export_is_one_verified_file(exported):
    assert "verified" in exported["stdout"] and "batch 64" in exported["stdout"]
    assert sorted(p.name for p in exported["root"].iterdir() if p.is_file()) == ["policy.onnx"]
    model = onnx.load(str(exported["onnx"]))
    onnx.checker.check_model(model)
    inputs = {i.name: i for i in model.graph.input}
    assert set(inputs) == {"observation", "desired_goal"} and [o.name for o in model.graph.output] == ["action"]
    for value in list(inputs.values()) + list(model.graph.output):
        assert value.type.tensor_type.shape.dim[0].dim_param  # dynamic batch, not frozen to 4


def test_metadata_describes_the_policy(exported):
    from her_mpi_runtime import Policy

    meta = Policy(exported["onnx"]).metadata
    assert (meta.algo, meta.env_id, meta.obs_dim, meta.goal_dim, meta.action_dim) == \
        (exported["algo"], "FetchReach-v4", 10, 3, 4)
    assert not meta.discrete and list(meta.action_low) == [-1] * 4 and list(meta.action_high) == [1] * 4
    assert meta.control_period_s == pytest.approx(0.04) and meta.rate_hz == pytest.approx(25.0)
    assert meta.train_env_steps == 2 * 50 * 2 and 0.0 <= meta.test_success_rate <= 1.0
    assert meta.training_config["algo"]["name"] == exported["algo"] and meta.her_mpi_version


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_runtime_matches_the_torch_policy(exported, batch):
    from her_mpi_runtime import Policy

    policy, module = Policy(exported["onnx"]), torch_policy(exported["checkpoint"])
    rng = np.random.default_rng(batch)
    obs = rng.normal(1.0, 0.5, (batch, 10)).astype(np.float32)
    goal = rng.normal(1.0, 0.3, (batch, 3)).astype(np.float32)
    with torch.inference_mode():
        expected = module(torch.from_numpy(obs), torch.from_numpy(goal)).numpy()
    np.testing.assert_allclose(policy.act(obs, goal), expected, atol=1e-5)
    for i in range(batch):  # single inputs (pre-bound buffers): each gives its own row's action
        np.testing.assert_allclose(policy.act(obs[i], goal[i]), expected[i], atol=1e-5)
    assert np.all(np.abs(policy.act(obs * 100, goal)) <= 1.0)  # scaled to the bounds


def test_runtime_rejects_bad_input_clearly(exported):
    from her_mpi_runtime import Policy, PolicyInputError

    policy = Policy(exported["onnx"])
    cases = [(np.zeros(9), np.zeros(3), "shape [10] or [batch, 10], got [9]"),
             (np.zeros(10), np.full(3, np.nan), "desired_goal contains NaN"),
             (np.zeros(10), np.array([0, np.inf, 0]), "NaN or Inf"),
             (["a"] * 10, np.zeros(3), "observation must be numeric"),
             (np.zeros((2, 10)), np.zeros((3, 3)), "batch sizes differ"),
             (np.zeros((2, 10)), np.zeros(3), "both be single vectors or both batches")]
    for obs, goal, message in cases:
        with pytest.raises(PolicyInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
            policy.act(obs, goal)
    with pytest.raises(FileNotFoundError, match="no policy file"):
        Policy(exported["root"] / "missing.onnx")
    with pytest.raises(TypeError, match="path must be an .onnx file path or 'zoo:NAME', got None"):
        Policy(None)
    for threads in ("abc", -1, 1.5, True):
        with pytest.raises(ValueError, match=f"intra_op_threads must be an integer >= 0 .*, got {threads!r}"):
            Policy(exported["onnx"], intra_op_threads=threads)


def test_runtime_never_imports_torch_mpi_or_mujoco(exported):
    code = (
        "import sys, numpy as np\n"
        "from her_mpi_runtime import Policy\n"
        f"policy = Policy({str(exported['onnx'])!r})\n"
        "policy.act(np.ones(10), np.ones(3)); policy.act(np.ones((5, 10)), np.ones((5, 3)))\n"
        "heavy = [m for m in ('torch', 'mpi4py', 'mujoco', 'gymnasium', 'her_mpi') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print('clean')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0 and "clean" in result.stdout, describe(result)


def test_evaluation_of_export_equals_checkpoint(exported):
    def evaluate(*source):
        result = run_python(["-m", "her_mpi.evaluate", *source, "--episodes", "20", "--seed", "3"])
        assert result.returncode == 0, describe(result)
        return json.loads(result.stdout.strip().splitlines()[-1])

    from_onnx = evaluate("--policy", exported["onnx"])
    from_checkpoint = evaluate("--checkpoint", exported["checkpoint"])
    assert from_onnx["env_id"] == "FetchReach-v4" and from_onnx["episodes"] == 20
    assert from_onnx["success_rate"] == from_checkpoint["success_rate"]
    assert from_onnx["reached_rate"] == from_checkpoint["reached_rate"] >= from_onnx["success_rate"]
    assert from_onnx["mean_return"] == pytest.approx(from_checkpoint["mean_return"])


def test_evaluating_on_an_env_of_other_sizes_fails_clearly(exported):
    result = run_python(["-m", "her_mpi.evaluate", "--policy", exported["onnx"], "--env", "FetchPush-v4",
                         "--episodes", "2"])
    assert result.returncode == 2 and "observations of size 25" in result.stderr and "expects 10" in result.stderr, \
        describe(result)


@pytest.mark.parametrize("args, message", [
    (["--seed", "-1"], "--seed must be >= 0"), (["--parallel-envs", "0"], "--parallel-envs must be >= 1")])
def test_evaluate_names_a_bad_number(exported, args, message):
    result = run_python(["-m", "her_mpi.evaluate", "--policy", exported["onnx"], *args])
    assert result.returncode == 2 and message in result.stderr, describe(result)


def test_export_checks_its_arguments_before_it_writes(exported, tmp_path):
    kept = tmp_path / "kept.onnx"
    kept.write_bytes(b"an earlier export")
    result = run_python(["-m", "her_mpi.export", "--checkpoint", exported["checkpoint"], "--output", kept,
                         "--card", "--card-seed", "-1"])
    assert result.returncode == 2 and "--card-seed -1: expected an integer >= 0" in result.stderr, describe(result)
    assert kept.read_bytes() == b"an earlier export"
    result = run_python(["-m", "her_mpi.export", "--checkpoint", exported["checkpoint"], "--output", tmp_path])
    assert result.returncode == 2 and "is a directory: expected the .onnx file" in result.stderr, describe(result)


def test_export_of_a_missing_checkpoint_fails_clearly(tmp_path):
    result = run_python(["-m", "her_mpi.export", "--checkpoint", tmp_path / "nope.pt", "--output", tmp_path / "p.onnx"])
    assert result.returncode == 2 and "no checkpoint" in result.stderr, describe(result)
    assert not (tmp_path / "p.onnx").exists()


def test_verification_failure_exits_nonzero_with_the_numbers(exported, tmp_path, monkeypatch, capsys):
    import her_mpi.export as export_module

    monkeypatch.setattr(export_module, "verify", lambda *args: {1: 3e-3, 3: 1e-6, 64: 2e-3})
    code = export_module.main(["--checkpoint", str(exported["checkpoint"]), "--output", str(tmp_path / "p.onnx")])
    err = capsys.readouterr().err
    assert code == 1 and "FAILED" in err and "batch 1: 3.00e-03" in err and "batch 64: 2.00e-03" in err


def test_verify_detects_a_policy_that_differs(exported):
    from her_mpi.export import verify

    module = torch_policy(exported["checkpoint"])
    assert max(verify(exported["onnx"], module, 10, 3).values()) <= 1e-5
    with torch.no_grad():
        next(module.network.parameters()).add_(0.5)  # the torch side no longer matches the file
    assert max(verify(exported["onnx"], module, 10, 3).values()) > 1e-3


def test_the_tolerance_allows_for_the_networks_own_float32_rounding(exported):
    from her_mpi.export import float32_error

    # a float64 copy of the policy differs from it by float32 rounding alone: small, and not nothing
    assert 0 < float32_error(torch_policy(exported["checkpoint"]), 10, 3) < 1e-5
    assert "x torch's own float32 error" in exported["stdout"]
