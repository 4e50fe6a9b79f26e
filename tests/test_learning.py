"""Learning tests: a trained policy succeeds where an untrained one does not (real MuJoCo, mpirun)."""

import pytest

from helpers import describe, read_progress, run_mpi

pytestmark = [pytest.mark.slow, pytest.mark.mpi]

# FetchReach at np=2 with n_cycles=10 (1,000 env steps per rank per epoch).
REACH = ["--set", "train.n_cycles=10", "--set", "train.n_test_episodes=50", "--set", "log.tensorboard=false"]
REACH_RECIPES = {name: f"configs/fetch_reach_{name}.yaml" for name in ("ddpg", "td3", "sac", "ddpg_kfac", "td3_kfac")}
EXTRA = {"td3_kfac_rank32": ("td3_kfac", ["--set", "algo.kfac.rank=32"])}  # low-rank K-FAC: a quarter of the multiplies


def train(tmp_path, recipe, *overrides, epochs=2):
    run_dir = tmp_path / "run"
    result = run_mpi(2, ["-m", "her_mpi.train", "--config", recipe, "--run-dir", run_dir,
                         "--set", f"train.n_epochs={epochs}", *REACH, *overrides])
    assert result.returncode == 0, describe(result)
    return [float(r["test_success_rate"]) for r in read_progress(run_dir)]


@pytest.mark.parametrize("algo", sorted([*REACH_RECIPES, *EXTRA]))
def test_fetch_reach_is_solved_within_two_epochs(tmp_path, algo):
    recipe, overrides = EXTRA.get(algo, (algo, []))
    success = train(tmp_path, REACH_RECIPES[recipe], "--set", "train.stop_success=0.9", *overrides)
    assert max(success) >= 0.9, f"{algo} test success per epoch: {success}"


def test_untrained_policy_fails_fetch_reach(tmp_path):
    # the same pipeline with no gradient updates: the policy stays at its random initialisation
    success = train(tmp_path, REACH_RECIPES["ddpg"], "--set", "train.n_batches=0", epochs=1)
    assert success[0] <= 0.3, f"untrained success {success}"


def bitflip_success(tmp_path, *overrides, epochs=1):
    run_dir = tmp_path / "bitflip"
    result = run_mpi(2, ["-m", "her_mpi.train", "--config", "configs/bitflip_10_dqn.yaml", "--run-dir", run_dir,
                         "--set", f"train.n_epochs={epochs}", "--set", "log.tensorboard=false", *overrides])
    assert result.returncode == 0, describe(result)
    return float(read_progress(run_dir)[-1]["test_success_rate"])


# 10-bit flipping, np=2: one epoch is 50 cycles x 16 episodes per rank (~11k env steps in all).
# Importance weights (beta annealed from 0.4) slow prioritized replay's start: it gets 2 epochs.
@pytest.mark.parametrize("prioritized, epochs", [(False, 1), (True, 2)])
def test_dqn_with_hindsight_solves_10_bit_flipping(tmp_path, prioritized, epochs):
    success = bitflip_success(tmp_path, "--set", f"replay.prioritized={str(prioritized).lower()}",
                              "--set", "train.stop_success=0.9", epochs=epochs)
    assert success >= 0.9, success


def test_dqn_without_hindsight_fails_10_bit_flipping_at_the_same_budget(tmp_path):
    assert bitflip_success(tmp_path, "--set", "replay.strategy=none") <= 0.1


def run_recipe(tmp_path, recipe, epochs, *overrides, name="run"):
    run_dir = tmp_path / name
    result = run_mpi(2, ["-m", "her_mpi.train", "--config", recipe, "--run-dir", run_dir,
                         "--set", f"train.n_epochs={epochs}", "--set", "log.tensorboard=false", *overrides])
    assert result.returncode == 0, describe(result)
    return [float(r["test_success_rate"]) for r in read_progress(run_dir)]


def test_htrpo_solves_8_bit_flipping(tmp_path):
    success = run_recipe(tmp_path, "configs/bitflip_8_htrpo.yaml", 12, "--set", "train.stop_success=0.9")
    assert max(success) >= 0.9, success


def test_hpg_solves_8_bit_flipping_where_its_untrained_policy_does_not(tmp_path):
    # bitflip_8_hpg reaches 0.9 at ~25k env steps (epoch ~10) on seeds 0-3 (experiments/results/htrpo_vs_hpg.md);
    # the control is the same pipeline with Adam steps too small to move the policy
    trained = run_recipe(tmp_path, "configs/bitflip_8_hpg.yaml", 16, "--set", "train.stop_success=0.9", name="trained")
    untrained = run_recipe(tmp_path, "configs/bitflip_8_hpg.yaml", 2, "--set", "algo.lr_actor=1e-12", name="untrained")
    assert max(untrained) <= 0.1, untrained
    assert max(trained) >= 0.9, trained


def test_ppo_her_beats_ppo_on_predator_prey_at_equal_budget(tmp_path):
    # three epochs each: 15 iterations of ~2,500 env steps over both ranks
    her = run_recipe(tmp_path, "configs/predator_prey_ppo_her.yaml", 3, name="ppo_her")
    plain = run_recipe(tmp_path, "configs/predator_prey_ppo.yaml", 3, name="ppo")
    assert her[-1] >= 0.15 and her[-1] >= plain[-1] + 0.1, (her, plain)


def test_htrpo_solves_continuous_fetch_reach_and_holds_it(tmp_path):
    # success is judged at the last step: a policy that reaches the goal and drifts off fails there
    # (the recipe without algo.hold_goal peaks at 1.0 and falls back to 0.55-0.98). Seeds 0-3 read
    # 1.00 at every evaluation from epoch 4 (experiments/results/htrpo_reach_hold.md).
    success = run_recipe(tmp_path, "configs/fetch_reach_htrpo.yaml", 8)
    assert success[0] <= 0.3 and min(success[-3:]) >= 0.9, success
