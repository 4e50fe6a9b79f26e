"""Algorithms are known by the name the config stores, never recovered from a parameter type."""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import yaml

from her_mpi import registry
from her_mpi.algos import ALGORITHMS
from her_mpi.algos.base import OffPolicyAgent
from her_mpi.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from her_mpi.algos.htrpo import HPG, HTRPO, HPGParams, HTRPOParams
from her_mpi.config import ConfigError, config_from_dict, load_config
from her_mpi.envs import EnvSpec
from her_mpi.trainer import agent_from_checkpoint, build_agent

CONTINUOUS = EnvSpec("PredatorPrey-v0", 4, 2, False, 2, 0, (-1.0, -1.0), (1.0, 1.0), 20, 0.0, (0.0, 1.0))
DISCRETE = EnvSpec("BitFlipping-v0", 6, 6, True, 1, 6, (), (), 6, 0.0)


def spec_for(name: str) -> EnvSpec:
    return DISCRETE if name == "dqn" else CONTINUOUS


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_registered_name_builds_that_algorithm_and_round_trips(name, tmp_path):
    small_replay = ["replay.size=1000"] if issubclass(ALGORITHMS[name], OffPolicyAgent) else []  # on-policy: no replay
    config = load_config(None, [f"algo={name}", f"env.id={spec_for(name).env_id}", *small_replay])
    assert config.algo_name == name and type(config.algo) is ALGORITHMS[name].Params
    agent = build_agent(config, spec_for(name))
    assert type(agent) is ALGORITHMS[name]

    # config.yaml: what a run writes, loaded back as a recipe
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml())
    again = load_config(path)
    assert again.algo_name == name and again.algo == config.algo
    assert yaml.safe_load(path.read_text())["algo"]["name"] == name

    # a checkpoint: the trainer stores config.to_dict(); export and resume rebuild from it
    state = {"algo": config.algo_name, "config": config.to_dict(), "spec": dataclasses.asdict(spec_for(name)),
             "agent": agent.state_dict()}
    save_checkpoint(tmp_path / "latest.pt", state)
    loaded = load_checkpoint(tmp_path / "latest.pt")
    check_compatible(loaded, spec_for(name).env_id, name)  # what --resume checks
    rebuilt = agent_from_checkpoint(loaded)
    assert type(rebuilt) is ALGORITHMS[name] and rebuilt.config.algo_name == name


def test_parameter_classes_are_distinct_so_no_name_shares_one():
    params = [cls.Params for cls in ALGORITHMS.values()]
    assert len(set(params)) == len(params)


def test_hpg_is_hpg_with_its_own_parameters():
    config = load_config(None, ["algo=hpg", "env.id=PredatorPrey-v0"])
    assert type(config.algo) is HPGParams and not isinstance(config.algo, HTRPOParams)
    fields = {f.name for f in dataclasses.fields(HPGParams)}
    assert "lr_actor" in fields and not fields & {"max_kl", "cg_iters", "cg_damping", "line_search_steps",
                                                 "hvp_subsample", "kl"}
    agent = build_agent(config, CONTINUOUS)
    assert type(agent) is HPG and not isinstance(agent, HTRPO)
    assert "policy" in agent.optimizers()  # an Adam step, not a trust-region step
    with pytest.raises(ConfigError, match="algo.max_kl"):
        load_config(None, ["algo=hpg", "algo.max_kl=0.01"])


def test_htrpo_keeps_no_hpg_step_size():
    with pytest.raises(ConfigError, match="algo.lr_actor"):
        load_config(None, ["algo=htrpo", "algo.lr_actor=0.01"])


def test_the_name_is_stored_not_inferred():
    config = config_from_dict({"algo": {"name": "hpg"}})
    config.algo = HTRPOParams()  # even a mismatching parameter object does not change the name
    assert config.algo_name == "hpg" and config.to_dict()["algo"]["name"] == "hpg"
    with pytest.raises(ConfigError, match="unknown config key 'algo_name'"):
        config_from_dict({"algo_name": "td3"})  # one place for the name in a file: algo.name


def test_the_config_module_does_not_import_the_algorithms():
    code = ("import sys, dataclasses, her_mpi.config as c; cfg = c.Config(); cfg.algo_name = 'hpg'; "
            "cfg.algo = dataclasses.make_dataclass('P', [('lr', float, 1.0)])(); "
            "assert cfg.to_dict()['algo'] == {'name': 'hpg', 'lr': 1.0}; print('her_mpi.algos' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_the_algorithms_do_not_import_the_config_loader():
    # dependencies run one way: config -> registry -> algorithms -> settings
    code = "import sys, her_mpi.algos; print('her_mpi.config' in sys.modules, 'her_mpi.registry' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


def test_the_registry_names_every_algorithm_by_its_own_name():
    assert {name: registry.algorithm_class(name) for name in registry.BUILTIN} == ALGORITHMS
    assert registry.algorithm_names() == sorted(ALGORITHMS)


def test_an_algorithm_registered_at_run_time_is_configurable(monkeypatch):
    monkeypatch.setattr(registry, "_registered", {})
    plugin = type("Plugin", (HPG,), {"name": "my_hpg"})
    registry.register_algorithm(plugin)
    assert "my_hpg" in registry.algorithm_names()
    assert type(load_config(None, ["algo=my_hpg", "algo.lr_actor=0.01"]).algo) is HPGParams
    with pytest.raises(ValueError, match="'td3' is already registered"):
        registry.register_algorithm(type("Other", (HPG,), {"name": "td3"}))


def test_hpg_learns_with_a_plain_gradient_step():
    from her_mpi.envs import make_env
    from her_mpi.config import EnvConfig
    from her_mpi.rollout import RolloutWorker

    # no input normalisation: its function-preserving rewrite of the first layer is not the step
    config = load_config(None, ["algo=hpg", "env.id=BitFlipping-v0", "env.kwargs={n_bits: 4}", "algo.n_goals=4",
                                "normalizer.enabled=false"])
    worker = RolloutWorker(config.env, 4, np.random.SeedSequence(0))
    agent = build_agent(config, worker.spec, make_env(EnvConfig("BitFlipping-v0", {"n_bits": 4})))
    episodes = worker.generate(lambda o, g: agent.act(o, g, explore=True), 8)
    before = agent.policy_optimizer.flat.param.clone()
    metrics = agent.learn(episodes)
    assert "surrogate" in metrics and "line_search_step" not in metrics
    step = (agent.policy_optimizer.flat.param - before).abs().max()
    assert 0 < float(step) <= 1.5 * config.algo.lr_actor  # Adam's first step moves each weight by <= lr
