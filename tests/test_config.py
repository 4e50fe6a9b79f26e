"""Config loading, overrides and validation: every mistake names the key and what was expected."""

from pathlib import Path

import pytest

from her_mpi.config import ConfigError, load_config
from conftest import ROOT

RECIPES = sorted((ROOT / "configs").glob("*.yaml"))


def error_of(*overrides, path=None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    return str(info.value)


def test_default_recipe_is_fetch_reach_ddpg():
    config = load_config()
    assert config.env.id == "FetchReach-v4" and config.algo_name == "ddpg"
    assert config.train.n_cycles == 10 and config.train.n_batches == 40 and config.train.batch_size == 256
    assert config.algo.polyak == 0.95 and config.algo.action_l2 == 1.0 and config.replay.replay_k == 4


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_loads(recipe):
    config = load_config(recipe)
    assert config.env.id


def test_unknown_key_names_it_and_suggests_the_nearest():
    message = error_of("train.n_epoch=3")
    assert "'train.n_epoch'" in message and "did you mean 'train.n_epochs'" in message


def test_unknown_algorithm_key_is_checked_against_that_algorithm():
    message = error_of("algo.polyk=0.9")
    assert "'algo.polyk'" in message and "algo.polyak" in message
    assert "policy_delay" in error_of("algo=td3", "algo.policy_dela=2")


def test_unknown_section_suggests_the_nearest():
    assert "did you mean 'replay'" in error_of("replya.size=10")


def test_wrong_type_is_named():
    message = error_of("train.n_epochs=many")
    assert "train.n_epochs" in message and "expected an integer" in message and "'many'" in message
    assert "expected true or false" in error_of("replay.prioritized=maybe")


def test_out_of_range_is_named():
    message = error_of("algo.polyak=1.5")
    assert "algo.polyak" in message and "1.5" in message and "[0, 1]" in message
    assert "train.batch_size" in error_of("train.batch_size=0")
    assert "algo.gamma" in error_of("algo.gamma=1.0")


def test_choice_suggests_the_nearest():
    message = error_of("replay.strategy=futur")
    assert "'futur'" in message and "did you mean 'future'" in message


def test_unknown_algorithm_lists_known_ones():
    message = error_of("algo=ddgp")
    assert "ddpg" in message and "did you mean 'ddpg'" in message


def test_missing_file_suggests_a_recipe(tmp_path):
    message = error_of(path=ROOT / "configs" / "fetch_psh_ddpg.yaml")
    assert "does not exist" in message and "fetch_push_ddpg" in message


def test_malformed_override():
    assert "section.key=value" in error_of("train.n_epochs")


def test_overrides_and_algorithm_switch():
    config = load_config(None, ["algo=td3", "algo.policy_delay=3", "train.n_epochs=7", "algo.hidden=[64, 64]"])
    assert config.algo_name == "td3" and config.algo.policy_delay == 3 and config.algo.hidden == [64, 64]
    assert config.train.n_epochs == 7


def test_inherit_merges_sections(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("env: {id: FetchPush-v4}\ntrain: {n_epochs: 5, n_cycles: 7}\n")
    child = tmp_path / "child.yaml"
    child.write_text("inherit: base.yaml\ntrain: {n_epochs: 9}\n")
    config = load_config(child)
    assert (config.env.id, config.train.n_epochs, config.train.n_cycles) == ("FetchPush-v4", 9, 7)


def test_resolved_config_round_trips(tmp_path):
    config = load_config(None, ["algo=td3", "train.n_epochs=3"])
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml())
    assert load_config(path).to_dict() == config.to_dict()


def test_switching_algorithm_starts_from_its_defaults(tmp_path):
    # fetch_reach_ddpg.yaml sets a DDPG-specific target schedule; TD3 recipes inherit the rest
    td3 = load_config(ROOT / "configs" / "fetch_reach_td3.yaml")
    assert td3.algo_name == "td3" and td3.algo.target_update_every == 2 and td3.train.n_cycles == 10
    assert load_config(None, ["algo=sac"]).algo.target_update_every == 2
    kept = load_config(None, ["algo.hidden=[64]"])
    assert kept.algo.target_update_every == 8 and kept.algo.hidden == [64]
