"""Config loading, overrides and validation: every mistake names the key and what was expected;
every key is documented; deprecated names still load; settings are never silently ignored."""

import dataclasses
import typing
import warnings

import numpy as np
import pytest
import torch
import yaml

from her_mpi import registry
from her_mpi.config import (SECTIONS, Config, ConfigError, UnusedSettingWarning, config_from_dict, load_config,
                            resolve_recipe, section_keys)
from her_mpi.envs import env_spec, make_env
from her_mpi.optim.kfac import KFACParams
from her_mpi.trainer import build_agent
from helpers import ROOT, describe, run_python

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


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_loads(recipe):
    """Every packaged recipe validates without deprecated names, makes its env, builds its
    algorithm on that env and acts within the action space."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # a recipe still using a deprecated name
        warnings.simplefilter("error", UnusedSettingWarning)  # or setting what its algorithm ignores
        config = load_config(recipe)
    env = make_env(config.env, seed=0)
    try:
        spec = env_spec(env, config.env.id)
        config.replay.size = config.train.rollouts_per_rank * spec.horizon  # the smallest valid buffer
        agent = build_agent(config, spec, env)
        assert type(agent) is registry.algorithm_class(config.algo_name)
        assert type(config.algo) is type(agent).Params
        obs, _ = env.reset(seed=0)
        action = agent.act(np.ravel(obs["observation"])[None].astype(spec.obs_dtype),
                           np.asarray(obs["desired_goal"], np.float32)[None], explore=False)
        assert action.shape == (1, spec.action_dim)
        if spec.discrete:
            assert 0 <= action[0, 0] < spec.n_actions
        else:
            assert np.all(np.abs(action) <= 1.0)  # agents act in [-1, 1]; the env's bounds come after
    finally:
        env.close()


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


def test_numbers_in_exponent_notation_are_numbers():
    # YAML 1.1 reads 3e-4 (no dot) as a string; the README's --set algo.lr_actor=3e-4 must work
    config = load_config(None, ["algo.lr_actor=3e-4", "replay.size=1e5"])
    assert config.algo.lr_actor == 3e-4 and config.replay.size == 100_000
    assert "expected an integer" in error_of("replay.size=1e-5")


def test_out_of_range_is_named():
    message = error_of("algo.polyak=1.5")
    assert "algo.polyak" in message and "1.5" in message and "[0, 1]" in message
    assert "train.batch_size" in error_of("train.batch_size=0")
    assert "algo.gamma" in error_of("algo.gamma=1.0")


def test_choice_suggests_the_nearest():
    message = error_of("replay.strategy=futur")
    assert "'futur'" in message and "did you mean 'future'" in message


@pytest.mark.parametrize("overrides, nearest", [
    (["algo=td3", "algo.optimizer=kfca"], "kfac"), (["algo=dqn", "algo.loss=mes"], "mse"),
    (["algo=htrpo", "algo.kl=qlk"], "qkl"), (["algo=htrpo", "algo.reward=spares"], "sparse"),
    (["algo=ppo", "algo.strategy=futur"], "future"), (["algo=ppo", "algo.activation=tahn"], "tanh"),
    (["algo=sac", "algo.activation=Relu"], "relu"), (["algo=td3", "algo.n_step_correction=lowerbound"], "lower_bound"),
    (["algo=ddpg", "algo.kfac.damping_mode=plian"], "plain"),
    (["algo=td3", "algo.kfac.split_preconditioning=atuo"], "auto")])
def test_every_choice_key_is_checked_by_the_shared_code_and_suggests_the_nearest(overrides, nearest):
    key, value = overrides[-1].split("=")
    message = error_of(*overrides)
    assert message.startswith(f"{key}: ") and repr(value) in message and f"did you mean {nearest!r}?" in message


def test_choice_keys_are_typed_by_their_choices():
    """Algorithm parameters are never a plain str (a choice is a Literal: validated, listed by
    --list-keys); a union with a choice still takes its other members."""
    classes = [registry.algorithm_class(name).Params for name in registry.algorithm_names()]
    for cls in classes + [KFACParams]:
        for name, hint in typing.get_type_hints(cls).items():
            assert hint is not str, f"{cls.__name__}.{name} is a plain str: declare its choices as Literal[...]"
    rows = {key: kind for key, kind, _, _ in section_keys(registry.algorithm_class("td3").Params, "algo")}
    assert rows["algo.optimizer"] == "adam | kfac" and rows["algo.activation"] == "relu | tanh | elu"
    assert rows["algo.kfac.split_preconditioning"] == "true | false | auto"
    for value, expected in (("false", False), ("true", True), ("auto", "auto")):
        kfac = load_config(None, ["algo.optimizer=kfac", f"algo.kfac.split_preconditioning={value}"]).algo.kfac
        assert kfac.split_preconditioning == expected and type(kfac.split_preconditioning) is type(expected)
    assert "expected true, false or 'auto', got 3" in error_of("algo.kfac.split_preconditioning=3")


def test_unknown_algorithm_lists_known_ones():
    message = error_of("algo=ddgp")
    assert "ddpg" in message and "did you mean 'ddpg'" in message


def test_missing_file_suggests_a_recipe(tmp_path, monkeypatch):
    message = error_of(path=ROOT / "configs" / "fetch_psh_ddpg.yaml")
    assert "does not exist" in message and "fetch_push_ddpg" in message
    assert "is a directory: expected a recipe file (.yaml)" in error_of(path=tmp_path)
    (tmp_path / "fetch_push_ddpg").mkdir()  # a sweep's output folder, named after the recipe
    monkeypatch.chdir(tmp_path)
    assert resolve_recipe("fetch_push_ddpg").name == "fetch_push_ddpg.yaml"


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


# -- every key documented ----------------------------------------------------------------------


def section_classes():
    hints = typing.get_type_hints(Config)
    yield from ((name, hints[name]) for name in SECTIONS if name != "algo")
    yield from ((f"algo ({name})", registry.algorithm_class(name).Params) for name in registry.algorithm_names())


@pytest.mark.parametrize("section, cls", list(section_classes()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_key_has_a_one_line_description(section, cls):
    rows = section_keys(cls, section.split()[0])
    assert rows
    for key, type_name, default, description in rows:
        assert description and "\n" not in description, f"{key} has no one-line description"
        assert type_name and default, key


def test_list_keys_prints_a_section():
    result = run_python(["-m", "her_mpi.train", "--list-keys", "replay"])
    assert result.returncode == 0, describe(result)
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["key", "type", "default", "description"]
    strategy = next(line for line in lines if line.startswith("replay.strategy "))
    assert "future | final" in strategy and "hindsight goals" in strategy
    assert not any(line.startswith(("train.", "algo.")) for line in lines)


def test_list_keys_shows_the_algorithm_a_recipe_chooses_else_every_algorithm():
    chosen = run_python(["-m", "her_mpi.train", "--list-keys", "algo", "--config", "fetch_push_td3_kfac"])
    assert chosen.returncode == 0, describe(chosen)
    assert "[algo, when algo.name is td3]" in chosen.stdout and "algo.kfac.damping " in chosen.stdout
    assert chosen.stdout.count("[algo") == 1
    every = run_python(["-m", "her_mpi.train", "--list-keys"])
    assert every.returncode == 0, describe(every)
    for name in registry.algorithm_names():
        assert f"[algo, when algo.name is {name}" in every.stdout
    for section in set(SECTIONS) - {"algo"}:
        assert f"[{section}]" in every.stdout
    assert "critic_lr -> lr_critic" in every.stdout  # deprecated names are listed with their algorithm


def test_list_keys_suggests_the_nearest_section():
    result = run_python(["-m", "her_mpi.train", "--list-keys", "replya"])
    assert result.returncode == 2 and "did you mean 'replay'" in result.stderr


# -- one learning-rate scheme; the old names still load -----------------------------------------


@pytest.mark.parametrize("algo, old, new", [("htrpo", "critic_lr", "lr_critic"), ("ppo", "critic_lr", "lr_critic"),
                                            ("ppo", "lr", "lr_actor"), ("hpg", "pg_lr", "lr_actor"),
                                            ("dqn", "lr", "lr_q")])
def test_deprecated_learning_rate_names_load_with_a_warning(algo, old, new):
    with pytest.warns(FutureWarning, match=f"algo.{old} is deprecated; use algo.{new}"):
        config = load_config(None, [f"algo={algo}", f"algo.{old}=0.0123"])
    assert getattr(config.algo, new) == 0.0123 and not hasattr(config.algo, old)
    message = error_of(f"algo={algo}", f"algo.{old}=0.1", f"algo.{new}=0.2")
    assert f"algo.{old}" in message and f"algo.{new}" in message


def test_a_checkpoint_config_with_the_old_names_loads(tmp_path):
    # config.yaml / the checkpoint's config of a run before the renaming: every key written out
    saved = load_config("fetch_push_htrpo").to_dict()
    saved["algo"]["critic_lr"] = saved["algo"].pop("lr_critic")
    with pytest.warns(FutureWarning, match="algo.critic_lr"):
        config = config_from_dict(saved)
    assert config.algo.lr_critic == 5e-4 and "critic_lr" not in config.to_dict()["algo"]


def test_a_run_from_before_the_renaming_resumes_with_the_new_names(tmp_path):
    from her_mpi import train
    from her_mpi.checkpoint import load_checkpoint, save_checkpoint

    run_dir, latest = tmp_path / "run", tmp_path / "run" / "checkpoints" / "latest.pt"
    tiny = ["--set", "train.n_cycles=1", "--set", "train.rollouts_per_rank=4", "--set", "train.n_test_episodes=2",
            "--set", "algo.n_goals=4", "--set", "log.tensorboard=false"]
    assert train.main(["--config", "bitflip_8_htrpo", "--run-dir", str(run_dir), "--set", "train.n_epochs=1",
                       *tiny]) == 0
    state = load_checkpoint(latest)
    state["config"]["algo"]["critic_lr"] = state["config"]["algo"].pop("lr_critic")  # as written before
    save_checkpoint(latest, {k: v for k, v in state.items() if k != "path"})
    with pytest.warns(FutureWarning, match="algo.critic_lr is deprecated; use algo.lr_critic"):
        assert train.main(["--resume", str(run_dir), "--set", "train.n_epochs=2", "--set", "algo.lr_critic=1e-3"]) == 0
    config = load_checkpoint(latest)["config"]["algo"]
    assert config["lr_critic"] == 1e-3 and "critic_lr" not in config


def test_learning_rates_share_one_name_scheme():
    for name in registry.algorithm_names():
        rates = [f.name for f in dataclasses.fields(registry.algorithm_class(name).Params) if "lr" in f.name]
        assert rates and all(rate.startswith("lr_") for rate in rates), (name, rates)


# -- settings are used or refused ---------------------------------------------------------------


@pytest.mark.parametrize("algo", ["ddpg", "td3"])
def test_kfac_refuses_adam_learning_rates(algo):
    for key in ("lr_actor", "lr_critic"):
        message = error_of(f"algo={algo}", "algo.optimizer=kfac", f"algo.{key}=3e-4")
        assert f"algo.{key}" in message and "algo.kfac.lr" in message
    assert load_config(None, [f"algo={algo}", "algo.optimizer=kfac", "algo.kfac.lr=0.01"]).algo.kfac.lr == 0.01
    assert load_config(None, [f"algo={algo}", "algo.lr_actor=3e-4"]).algo.lr_actor == 3e-4  # Adam uses it


def test_ppo_refuses_several_copies_of_the_final_goal():
    message = error_of("algo=ppo", "algo.strategy=final", "algo.replay_k=4")
    assert "algo.replay_k" in message and "final" in message
    assert load_config(None, ["algo=ppo", "algo.strategy=future", "algo.replay_k=4"]).algo.replay_k == 4


def test_sac_actor_uses_the_configured_activation():
    from her_mpi.envs import EnvSpec
    spec = EnvSpec("PredatorPrey-v0", 4, 2, False, 2, 0, (-1.0, -1.0), (1.0, 1.0), 20, 0.0, (0.0, 1.0))
    config = load_config(None, ["algo=sac", "env.id=PredatorPrey-v0", "replay.size=1000", "algo.activation=tanh"])
    agent = build_agent(config, spec)
    activations = [type(m) for m in agent.actor.modules() if not isinstance(m, (torch.nn.Linear,))
                   and not list(m.children())]
    assert activations and set(activations) == {torch.nn.Tanh}


# -- settings the chosen algorithm would ignore are refused -------------------------------------

OFF_POLICY_SCHEDULE = ["replay.size=1000", "replay.replay_k=2", "replay.strategy=final", "replay.prioritized=true",
                       "train.n_batches=3", "train.batch_size=32", "train.sync_check_every=1",
                       "checkpoint.save_buffer=false"]


@pytest.mark.parametrize("algo", ["htrpo", "hpg", "ppo"])
@pytest.mark.parametrize("override", OFF_POLICY_SCHEDULE)
def test_on_policy_algorithms_refuse_the_off_policy_schedule(algo, override):
    key = override.split("=")[0]
    message = error_of(f"algo={algo}", override)
    assert message.startswith(f"{key}: ") and f"algo.name {algo}" in message, message
    reason = {"replay": "no replay buffer", "checkpoint": "no replay buffer",
              "train.sync_check_every": "after each epoch", "train.n_batches": "once per cycle",
              "train.batch_size": "minibatch" if algo == "ppo" else "every row"}
    assert next(why for prefix, why in reason.items() if key.startswith(prefix)) in message, message
    for default in ("train.n_batches=40", "train.batch_size=256", "checkpoint.save_buffer=true", "replay.replay_k=4"):
        load_config(None, [f"algo={algo}", default])  # a default written out (the sweep runner passes save_buffer)
    load_config(None, ["algo=td3", *OFF_POLICY_SCHEDULE])  # all read by off-policy algorithms


def test_ppo_says_where_its_batch_size_is():
    assert "algo.minibatch_size" in error_of("algo=ppo", "train.batch_size=64")
    assert "algo.critic_batch_size" in error_of("algo=htrpo", "train.batch_size=64")


@pytest.mark.parametrize("overrides, used", [
    (["algo=td3", "algo.kfac.damping=0.1"], ["algo.optimizer=kfac"]),
    (["algo=ddpg", "algo.n_step_correction=none"], ["algo.n_step=3"]),
    (["algo=sac", "replay.alpha=0.7"], ["replay.prioritized=true"]),
    (["algo=dqn", "replay.beta_anneal_updates=100"], ["replay.prioritized=true"]),
    (["algo=ddpg", "algo.target_noise_clip=0.3"], ["algo.target_noise=0.1"]),
    (["algo=td3", "algo.optimizer=kfac", "algo.lr_critic=3e-4"], ["algo.optimizer=adam"])])
def test_settings_of_a_feature_that_is_off_are_refused(overrides, used):
    key = overrides[-1].split("=")[0]
    message = error_of(*overrides)
    assert message.startswith(f"{key}: ") and "has no effect" in message
    # says which setting makes it idle (K-FAC: the learning rate it uses instead)
    named = "algo.kfac.lr" if overrides[-2:] == ["algo.optimizer=kfac", "algo.lr_critic=3e-4"] else used[0].split("=")[0]
    assert named in message, message
    load_config(None, [*overrides, *used])


def test_switching_hindsight_off_in_a_tuned_recipe_warns_about_its_goal_settings():
    """An ablation (TRPO, plain PPO, DQN without HER) of a recipe tuned with hindsight loads; the
    hindsight settings it no longer reads are named in a warning."""
    for recipe, overrides, key in [("bitflip_8_htrpo", ["algo.hindsight=false"], "algo.n_goals"),  # n_goals: 32
                                   ("predator_prey_ppo_her", ["algo.hindsight=false", "algo.strategy=future"],
                                    "algo.strategy"),
                                   ("fetch_push_td3_fast", ["replay.strategy=none"], "replay.replay_k")]:
        with pytest.warns(UnusedSettingWarning, match=f"{key}: .* has no effect .*(hindsight is false|strategy none)"):
            load_config(recipe, overrides)


def test_a_saved_config_with_the_defaults_of_its_time_still_loads(tmp_path):
    """A checkpoint's config (and config.yaml) lists every key with the defaults of the version
    that wrote it: it loads for resume, export and evaluation, and as a recipe with a warning;
    only what the user sets now is refused."""
    saved = load_config("fetch_push_htrpo").to_dict()
    saved["replay"]["size"], saved["train"]["n_batches"], saved["train"]["batch_size"] = 123, 7, 64  # another era
    assert config_from_dict(saved).train.n_batches == 7  # resume, export, evaluate
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(saved))
    with pytest.warns(UnusedSettingWarning, match="train.n_batches: 7 has no effect with algo.name htrpo"):
        assert load_config(path, ["train.n_epochs=3"]).train.n_epochs == 3
    assert "train.batch_size" in error_of("train.batch_size=32", path=path)  # set now: refused


def test_a_resume_refuses_only_what_its_command_sets(tmp_path, capsys):
    from her_mpi import train
    from her_mpi.checkpoint import load_checkpoint, save_checkpoint

    run_dir, latest = tmp_path / "run", tmp_path / "run" / "checkpoints" / "latest.pt"
    assert train.main(["--config", "bitflip_8_htrpo", "--run-dir", str(run_dir), "--set", "train.n_epochs=1",
                       "--set", "train.n_cycles=1", "--set", "train.rollouts_per_rank=4",
                       "--set", "train.n_test_episodes=2", "--set", "log.tensorboard=false"]) == 0
    state = load_checkpoint(latest)
    state["config"]["train"]["n_batches"] = 50  # a default of another time, written out by that run
    state["config"]["replay"]["replay_k"] = 8
    save_checkpoint(latest, {k: v for k, v in state.items() if k != "path"})
    capsys.readouterr()
    assert train.main(["--resume", str(run_dir), "--set", "train.n_epochs=2", "--set", "train.batch_size=64"]) == 2
    assert "train.batch_size: 64 has no effect with algo.name htrpo" in capsys.readouterr().err
    assert train.main(["--resume", str(run_dir), "--set", "train.n_epochs=2"]) == 0
    assert load_checkpoint(latest)["epoch"] == 1


@pytest.mark.parametrize("n_ranks, expected", [(2, (40, 256)), (8, (160, 64)), (1, (20, 512)), (4, (80, 128)),
                                               (3, (60, 171))])
def test_schedule_ranks_keeps_updates_per_env_step_and_transitions_per_update(n_ranks, expected):
    train = load_config("fetch_push_td3", ["train.schedule_ranks=2"]).train
    assert train.update_schedule(n_ranks) == expected
    assert load_config("fetch_push_td3").train.update_schedule(n_ranks) == (40, 256)  # the baselines schedule


def test_schedule_ranks_refuses_what_it_cannot_keep():
    with pytest.raises(ConfigError, match="train.schedule_ranks: got 0, expected an integer >= 1"):
        load_config("fetch_push_td3", ["train.schedule_ranks=0"])
    train = load_config("fetch_push_td3", ["train.schedule_ranks=1", "train.batch_size=2"]).train
    with pytest.raises(ConfigError, match="less than one transition per update on each of 8 ranks; expected "
                                          "batch_size >= 4"):
        train.update_schedule(8)
    def schedule(*overrides, n_ranks):
        return load_config("fetch_push_td3", list(overrides)).train.update_schedule(n_ranks)
    assert schedule("train.schedule_ranks=1", "train.batch_size=4", n_ranks=8)[1] == 1
    # a fraction of an update rounds half up, and never to none
    assert schedule("train.schedule_ranks=4", "train.n_batches=1", n_ranks=1)[0] == 1
    assert schedule("train.schedule_ranks=4", "train.n_batches=10", n_ranks=1)[0] == 3
    with pytest.raises(ConfigError, match="train.schedule_ranks"):  # on-policy: no updates to reschedule
        load_config("bitflip_8_htrpo", ["train.schedule_ranks=2"])
