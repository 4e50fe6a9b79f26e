"""The MPI contract, checked with real mpirun runs of the training code."""

import json

import numpy as np
import pytest

from helpers import PROGRAMS, describe, run_mpi, run_python

pytestmark = pytest.mark.mpi


def contract_result(result) -> dict:
    assert result.returncode == 0, describe(result)
    line = next(l for l in result.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return contract_result(run_mpi(2, [PROGRAMS / "mpi_contract.py", tmp_path_factory.mktemp("run")]))


def test_parameters_are_broadcast_and_stay_bit_identical(two_ranks):
    # ranks start from deliberately different weights; after the broadcast and training updates
    # every actor, critic, target and normalizer array is bit-identical
    assert two_ranks["size"] == 2 and two_ranks["n_synced_arrays"] > 20
    assert two_ranks["identical_after_training"] and two_ranks["identical_after_more_updates"]


def test_one_flat_allreduce_per_update(two_ranks):
    # DDPG: the actor's and the critic's gradients share one buffer and one collective
    assert two_ranks["allreduces_per_update"] == [1, 1, 1, 1]


def test_gradient_is_averaged_over_ranks(two_ranks):
    assert two_ranks["gradient_error"] < 1e-7


def test_normalizer_sync_equals_statistics_of_the_union(two_ranks):
    assert two_ranks["normalizer_error"] < 1e-5


def test_evaluation_success_is_averaged_over_ranks(two_ranks):
    per_rank = two_ranks["rank_success"]
    assert per_rank[0] != per_rank[1]
    assert two_ranks["logged_test_success"] == pytest.approx(np.mean(per_rank))


def test_seeds_differ_per_rank(two_ranks):
    first, second = two_ranks["rank_first_goal"]
    assert first != second


def test_env_steps_are_counted_per_rank_and_in_total(two_ranks):
    assert two_ranks["env_steps"] == 2 * two_ranks["env_steps_per_rank"] > 0


# One gradient collective per update for every algorithm: TD3's critic-only updates average the
# critic's part of the shared buffer, SAC's includes log(alpha); DQN has one network (with
# prioritized replay here, whose priorities stay per rank)
@pytest.mark.parametrize("algo, allreduces, recipe", [
    ("td3", [1], None), ("sac", [1], None), ("dqn", [1], "configs/bitflip_10_dqn.yaml"),
    ("ddpg+kfac", [1], None), ("td3+kfac", [1], None), ("td3+kfac-false", [1], None), ("td3+kfac-rank16", [1], None)])
def test_other_algorithms_stay_identical(tmp_path, algo, allreduces, recipe):
    extra = [recipe] if recipe else []
    result = contract_result(run_mpi(2, [PROGRAMS / "mpi_contract.py", tmp_path, algo, *extra]))
    assert result["identical_after_training"] and result["identical_after_more_updates"]
    assert sorted(set(result["allreduces_per_update"])) == allreduces


def test_works_without_mpirun(tmp_path):
    result = contract_result(run_python([PROGRAMS / "mpi_contract.py", tmp_path]))
    assert result["size"] == 1 and result["env_steps"] == result["env_steps_per_rank"] > 0


def test_works_with_more_ranks_than_cores(tmp_path):
    result = contract_result(run_mpi(3, [PROGRAMS / "mpi_contract.py", tmp_path]))
    assert result["size"] == 3 and result["identical_after_training"]
    assert result["env_steps"] == 3 * result["env_steps_per_rank"]


def test_a_crash_on_one_rank_stops_the_whole_job(tmp_path):
    # A long run (50 epochs): if the crash left rank 0 waiting in a collective, the subprocess
    # timeout (well below the 600 s hang watchdog) would fire instead of a non-zero exit.
    result = run_mpi(2, [PROGRAMS / "inject_fault.py", "--run-dir", tmp_path / "run",
                         "--set", "train.n_epochs=50"], timeout=300)
    assert result.returncode != 0, describe(result)
    assert "injected fault on rank 1" in result.stderr and "[her_mpi rank 1/2]" in result.stderr


def test_kfac_factors_are_part_of_the_identity_check(tmp_path):
    result = contract_result(run_mpi(2, [PROGRAMS / "mpi_contract.py", tmp_path, "ddpg+kfac"]))
    adam = contract_result(run_mpi(2, [PROGRAMS / "mpi_contract.py", tmp_path / "adam", "ddpg"]))
    # 8 Linear layers (actor 4, critic 4), an A and a G factor each
    assert result["n_synced_arrays"] == adam["n_synced_arrays"] + 16
    assert result["identical_after_training"] and result["identical_after_more_updates"]


# On-policy: every CG Hessian-vector product, line-search value, WIS sum and minibatch gradient
# is reduced over ranks, and hindsight goals are chosen from all ranks' achieved goals.
@pytest.mark.parametrize("algo, recipe", [("htrpo", "configs/bitflip_8_htrpo.yaml"),
                                          ("hpg", "configs/bitflip_8_htrpo.yaml"),
                                          ("htrpo", "configs/fetch_reach_htrpo.yaml"),
                                          ("ppo", "configs/predator_prey_ppo_her.yaml")])
def test_on_policy_algorithms_stay_identical(tmp_path, algo, recipe):
    result = contract_result(run_mpi(2, [PROGRAMS / "mpi_contract.py", tmp_path, algo, recipe]))
    assert result["identical_after_training"] and result["identical_after_more_updates"]
    assert result["env_steps"] > 0
