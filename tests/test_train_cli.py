"""`python -m her_mpi.train` end to end under mpirun: run outputs, resume, and bad input."""

import json
import math
import shutil

import pytest
import torch

from her_mpi.checkpoint import load_checkpoint
from her_mpi.config import config_from_dict
from her_mpi.envs import EnvSpec
from her_mpi.logger import progress_line
from her_mpi.trainer import agent_from_checkpoint, build_agent

from helpers import PROGRAMS, TINY, describe, read_progress, run_mpi, run_python

pytestmark = pytest.mark.mpi

CONTRACT_COLUMNS = ["epoch", "env_steps", "env_steps_per_rank", "n_ranks", "test_success_rate",
                    "train_success_rate", "time_s"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "reach"
    args = ["-m", "her_mpi.train", "--run-dir", run_dir, "--set", "train.n_epochs=2",
            "--set", "checkpoint.every=1", *TINY, "--set", "log.tensorboard=true"]
    result = run_mpi(2, args)
    assert result.returncode == 0, describe(result)
    return run_dir, result


def test_run_directory_contract(finished_run):
    run_dir, _ = finished_run
    assert (run_dir / "config.yaml").is_file()
    rows = read_progress(run_dir)
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    assert list(rows[0])[: len(CONTRACT_COLUMNS)] == CONTRACT_COLUMNS
    for column in ("critic_loss", "actor_loss", "q_mean", "steps_per_s"):
        assert column in rows[0]
    assert rows[-1]["n_ranks"] == "2"
    assert int(rows[-1]["env_steps"]) == 2 * int(rows[-1]["env_steps_per_rank"]) == 2 * 2 * 2 * 2 * 50
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    for name in ("latest.pt", "best.pt", "epoch_0001.pt", "epoch_0002.pt"):
        assert (run_dir / "checkpoints" / name).is_file(), name
    assert not list((run_dir / "checkpoints").glob("*.tmp"))  # atomic writes leave no debris


def test_the_run_record_says_finished_only_after_the_budget(finished_run):
    run_dir, _ = finished_run
    record = json.loads((run_dir / "status.json").read_text())
    assert record["state"] == "finished" and record["exit_status"] == 0
    assert record["epoch"] == 2 and record["n_ranks"] == 2


def test_every_rank_writes_into_the_one_run_directory_rank_0_named(tmp_path):
    # eight ranks whose clocks straddle second boundaries: each would name another default directory
    first = run_mpi(8, [PROGRAMS / "train_clock_skewed.py", *TINY, "--set", "train.n_epochs=1"], cwd=tmp_path)
    assert first.returncode == 0, describe(first)
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1, runs
    assert sorted(p.name for p in (runs[0] / "checkpoints").glob("replay_rank*")) == [f"replay_rank{r}" for r in range(8)]
    resumed = run_mpi(8, ["-m", "her_mpi.train", "--resume", runs[0], "--set", "train.n_epochs=2"], cwd=tmp_path)
    assert resumed.returncode == 0, describe(resumed)
    assert "empty replay buffer" not in resumed.stderr, describe(resumed)


def test_progress_line_per_epoch(finished_run):
    _, result = finished_run
    lines = [l for l in result.stdout.splitlines() if l.startswith("epoch ")]
    assert len(lines) == 2
    for part in ("test success", "env steps", "/rank x 2 ranks", "steps/s", "ETA"):
        assert part in lines[-1]


def test_progress_line_shows_a_budget_in_env_steps():
    """With train.max_env_steps the epoch count is only a cap: the line shows the steps against the budget."""
    row = {"epoch": 2, "test_success_rate": 0.5, "train_success_rate": 0.25, "env_steps": 30000,
           "env_steps_per_rank": 15000, "n_ranks": 2, "steps_per_s": 100.0}
    by_epochs = progress_line(row, 50, 10.0, 60.0)
    by_steps = progress_line(row, 1000, 10.0, 60.0, max_env_steps=400000)
    assert by_epochs.startswith("epoch 3/50 |") and "env steps 30,000 total" in by_epochs
    assert by_steps.startswith("epoch 3 |") and "env steps 30,000/400,000 total" in by_steps


def test_checkpoint_holds_what_resuming_needs(finished_run):
    run_dir, _ = finished_run
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)  # plain data only
    assert state["algo"] == "ddpg" and state["epoch"] == 1 and state["n_ranks"] == 2 and state["cycle"] == 0
    assert {"actor", "critic", "actor_target", "critic_target"} <= {k.split(".")[0] for k in state["agent"]["nets"]}
    assert set(state["agent"]["optimizers"]) == {"actor", "critic"}
    assert len(state["ranks"]) == 2  # every rank's own state
    assert {"agent", "train_envs", "test_envs", "torch_global"} <= set(state["ranks"][1]["rng"])
    for rank in (0, 1):  # replay buffers are kept by default
        generation = state["ranks"][rank]["replay_generation"]
        assert (run_dir / "checkpoints" / f"replay_rank{rank}" / f"manifest-g{generation:08d}.json").is_file()


def test_resume_continues_at_the_next_epoch(finished_run):
    run_dir, _ = finished_run
    before = read_progress(run_dir)
    result = run_mpi(2, ["-m", "her_mpi.train", "--resume", run_dir, "--set", "train.n_epochs=3"])
    assert result.returncode == 0, describe(result)
    assert "epoch 3/3" in result.stdout and "epoch 1/3" not in result.stdout
    rows = read_progress(run_dir)
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert rows[:2] == before
    assert int(rows[2]["env_steps"]) > int(rows[1]["env_steps"])
    assert int(rows[2]["updates"]) == int(rows[1]["updates"]) + 2 * 3  # counters carried over
    assert float(rows[2]["time_s"]) > float(rows[1]["time_s"])


def test_resuming_a_run_with_no_epochs_left_keeps_its_record(finished_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run[0], run_dir)
    before, progress = json.loads((run_dir / "status.json").read_text()), read_progress(run_dir)
    result = run_python(["-m", "her_mpi.train", "--resume", run_dir, "--set", "train.n_epochs=1"])
    assert result.returncode == 0, describe(result)
    assert f"the run has {len(progress)} epochs done and train.n_epochs = 1: nothing to train" in result.stdout
    after = json.loads((run_dir / "status.json").read_text())
    assert after["state"] == "finished" and read_progress(run_dir) == progress
    assert {k: after[k] for k in ("epoch", "env_steps", "test_success_rate")} == \
        {k: before[k] for k in ("epoch", "env_steps", "test_success_rate")}


@pytest.mark.parametrize("algo, extra", [("td3", []), ("sac", []), ("td3", ["--set", "algo.optimizer=kfac"])])
def test_other_algorithms_checkpoint_and_resume(tmp_path, algo, extra):
    run_dir = tmp_path / "run"
    result = run_mpi(2, ["-m", "her_mpi.train", "--run-dir", run_dir, "--set", f"algo={algo}",
                         "--set", "train.n_epochs=1", *extra, *TINY])
    assert result.returncode == 0, describe(result)
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)
    assert state["algo"] == algo and state["config"]["algo"]["name"] == algo
    result = run_mpi(2, ["-m", "her_mpi.train", "--resume", run_dir, "--set", "train.n_epochs=2"])
    assert result.returncode == 0, describe(result)
    rows = read_progress(run_dir)
    assert [int(r["epoch"]) for r in rows] == [0, 1] and "epoch 2/2" in result.stdout
    assert list(rows[0])[: len(CONTRACT_COLUMNS)] == CONTRACT_COLUMNS


def test_replay_buffers_are_kept_unless_switched_off(tmp_path):
    run_dir = tmp_path / "run"
    args = ["-m", "her_mpi.train", "--run-dir", run_dir, "--set", "train.n_epochs=1",
            "--set", "checkpoint.save_buffer=true", *TINY]  # the key the sweep runner passes
    result = run_mpi(2, args)
    assert result.returncode == 0, describe(result)
    for rank in (0, 1):
        assert (run_dir / "checkpoints" / f"replay_rank{rank}" / "manifest-g00000001.json").is_file()
    result = run_mpi(2, ["-m", "her_mpi.train", "--resume", run_dir, "--set", "train.n_epochs=2",
                         "--set", "checkpoint.save_buffer=false"])
    assert result.returncode == 0 and "empty replay buffer" not in result.stderr, describe(result)
    # That resume saved no replay files: the next one starts with empty buffers and says so.
    # (A resume keeps the checkpoint's config, save_buffer=false included, unless told otherwise.)
    result = run_mpi(2, ["-m", "her_mpi.train", "--resume", run_dir, "--set", "train.n_epochs=3",
                         "--set", "checkpoint.save_buffer=true"])
    assert result.returncode == 0, describe(result)
    assert "rank 1: no replay files of checkpoint generation 2" in result.stderr, describe(result)
    assert "starting with an empty replay buffer, so this resume is not exact" in result.stderr
    # and it saved them again: only the newest generation's files remain
    assert sorted(p.name for p in (run_dir / "checkpoints" / "replay_rank0").glob("manifest-*")) == \
        ["manifest-g00000003.json"]


def test_resume_on_fewer_ranks_keeps_counting_env_steps(tmp_path):
    run_dir = tmp_path / "run"
    result = run_mpi(2, ["-m", "her_mpi.train", "--run-dir", run_dir, "--set", "train.n_epochs=1", *TINY])
    assert result.returncode == 0, describe(result)
    result = run_mpi(1, ["-m", "her_mpi.train", "--resume", run_dir, "--set", "train.n_epochs=2"])
    assert result.returncode == 0, describe(result)
    assert "not restored: each rank's random streams" in result.stderr, describe(result)
    assert "the replay buffers of old ranks 1..1" in result.stderr, describe(result)
    first, second = read_progress(run_dir)
    assert int(first["n_ranks"]) == 2 and int(second["n_ranks"]) == 1
    per_rank_epoch = int(first["env_steps_per_rank"])
    assert int(second["env_steps"]) == int(first["env_steps"]) + per_rank_epoch
    assert int(second["env_steps_per_rank"]) == 2 * per_rank_epoch


# -- bad input: a clear message and a non-zero exit from every rank, before any collective ------

def fails_with(args, *fragments, n=2):
    result = run_mpi(n, ["-m", "her_mpi.train", *map(str, args)], timeout=120)
    assert result.returncode == 2 or (result.returncode != 0 and n > 1), describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    for fragment in fragments:
        assert fragment in result.stderr, describe(result)
    assert not any(line.startswith("epoch ") for line in result.stdout.splitlines()), describe(result)  # no training
    return result


def test_training_stops_at_the_first_evaluation_that_reaches_stop_success(tmp_path):
    run_dir = tmp_path / "run"
    # no gradient updates: the untrained policy's test success (0, 0, 0.02 with seed 0) decides
    result = run_mpi(2, ["-m", "her_mpi.train", "--run-dir", run_dir, "--set", "train.n_epochs=6",
                         "--set", "train.n_cycles=1", "--set", "train.n_batches=0", "--set", "train.n_test_episodes=50",
                         "--set", "log.tensorboard=false", "--set", "train.stop_success=0.02"])
    assert result.returncode == 0, describe(result)
    success = [float(r["test_success_rate"]) for r in read_progress(run_dir)]
    assert len(success) < 6 and success[-1] >= 0.02 and all(s < 0.02 for s in success[:-1]), success
    assert f"reached train.stop_success = 0.02 after epoch {len(success)}; stopping" in result.stdout


def test_unknown_config_key(tmp_path):
    fails_with(["--run-dir", tmp_path, "--set", "train.n_cyles=3"], "'train.n_cyles'", "did you mean 'train.n_cycles'")


def test_value_of_the_wrong_type_or_range(tmp_path):
    fails_with(["--run-dir", tmp_path, "--set", "train.batch_size=big"], "train.batch_size", "expected an integer")
    fails_with(["--run-dir", tmp_path, "--set", "replay.replay_k=-1"], "replay.replay_k", "-1", ">= 0")
    fails_with(["--run-dir", tmp_path, "--set", "train.stop_success=1.5"], "train.stop_success", "1.5", "(0, 1]")


def test_unknown_env_lists_known_ones(tmp_path):
    fails_with(["--run-dir", tmp_path, "--set", "env.id=FetchPushh-v4"], "FetchPushh-v4",
               "FetchReach-v4", "FetchPush-v4", "HandReach-v3")


def test_algorithm_that_cannot_act_in_the_env(tmp_path):
    fails_with(["--run-dir", tmp_path, "--set", "env.id=BitFlipping-v0", "--set", "env.kwargs={n_bits: 5}"],
               "ddpg needs continuous actions", "BitFlipping-v0", "dqn")
    fails_with(["--run-dir", tmp_path, "--set", "algo=dqn"], "dqn needs discrete actions", "FetchReach-v4")


def test_invalid_env_parameter(tmp_path):
    fails_with(["--run-dir", tmp_path, "--config", "configs/bitflip_10_dqn.yaml", "--set", "env.kwargs={n_bits: 0}"],
               "n_bits must be an integer >= 1", "got 0")


def test_resume_without_checkpoint(tmp_path):
    fails_with(["--resume", tmp_path], "no checkpoint", str(tmp_path))


def test_checkpoint_of_another_env(finished_run):
    run_dir, _ = finished_run
    fails_with(["--resume", run_dir, "--set", "env.id=FetchPush-v4"], "FetchReach-v4", "FetchPush-v4",
               "was trained with")


def test_checkpoint_that_does_not_fit_the_networks(finished_run):
    run_dir, _ = finished_run
    fails_with(["--resume", run_dir, "--set", "algo.hidden=[64, 64]"], "does not fit the networks")


def test_replay_memory_smaller_than_a_cycle(tmp_path):
    fails_with(["--run-dir", tmp_path, "--set", "replay.size=60", *TINY], "replay.size = 60",
               "expected replay.size >= 100")


def test_refuses_to_overwrite_an_existing_run(finished_run, tmp_path):
    run_dir, _ = finished_run
    fails_with(["--run-dir", run_dir], "already holds a run", "--resume")
    (tmp_path / "notes.txt").write_text("kept")
    fails_with(["--run-dir", tmp_path / "notes.txt"], "is a file: expected a directory")
    assert (tmp_path / "notes.txt").read_text() == "kept"


def test_error_without_mpirun_exits_2(tmp_path):
    result = run_python(["-m", "her_mpi.train", "--run-dir", tmp_path, "--set", "algo.policy_dlay=2"], timeout=120)
    assert result.returncode == 2 and "did you mean 'algo.policy_delay'" in result.stderr, describe(result)


def test_plot_writes_png(finished_run, tmp_path):
    run_dir, _ = finished_run
    output = tmp_path / "success.png"
    result = run_python(["-m", "her_mpi.plot", run_dir, run_dir, "--output", output])
    assert result.returncode == 0, describe(result)
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("recipe", ["fetch_push_ddpg", "fetch_pick_and_place_td3", "fetch_slide_sac",
                                    "hand_reach_ddpg_kfac"])
def test_every_robotics_env_trains(tmp_path, recipe):
    """Each MuJoCo task runs end to end with one of its recipes: its few updates give finite
    losses and move every trained network (and SAC's temperature) to finite new values."""
    run_dir = tmp_path / "run"
    result = run_python(["-m", "her_mpi.train", "--config", f"configs/{recipe}.yaml", "--run-dir", run_dir,
                         "--set", "train.n_epochs=1", *TINY])
    assert result.returncode == 0, describe(result)
    row = read_progress(run_dir)[0]
    assert int(row["env_steps"]) == 2 * 2 * 50
    assert float(row["critic_loss"]) > 0 and math.isfinite(float(row["critic_loss"]))
    assert math.isfinite(float(row["actor_loss"]))
    state = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    trained = agent_from_checkpoint(state)
    # the same seed builds the same initial weights the run started from
    initial = build_agent(config_from_dict(state["config"]), EnvSpec(**state["spec"]))
    for name, optimizer in trained.optimizers().items():
        after, before = optimizer.flat.param, initial.optimizers()[name].flat.param
        assert torch.isfinite(after).all() and not torch.equal(after, before), name


@pytest.mark.parametrize("n_ranks", [1, 2])
def test_schedule_ranks_keeps_the_updates_per_env_step_at_any_rank_count(tmp_path, n_ranks):
    # tuned at 2 ranks: 3 updates of 32 per cycle; at 1 rank half the env steps per cycle, so
    # 2 (rounded from 1.5) updates of 64; at 2 ranks the recipe as written
    args = ["-m", "her_mpi.train", "--run-dir", tmp_path / "run", "--set", "train.n_epochs=1",
            "--set", "train.schedule_ranks=2", *TINY]
    result = run_mpi(n_ranks, args) if n_ranks > 1 else run_python(args)
    assert result.returncode == 0, describe(result)
    updates_per_cycle = {1: 2, 2: 3}[n_ranks]
    assert int(read_progress(tmp_path / "run")[0]["updates"]) == 2 * updates_per_cycle
    said = "each cycle runs 2 updates of 64 transitions per rank (recipe: 3 of 32)"
    assert (said in result.stdout) == (n_ranks == 1), result.stdout


def test_schedule_ranks_sets_the_batch_each_update_samples(monkeypatch):
    from her_mpi.config import load_config
    from her_mpi.envs import env_spec, make_env

    config = load_config("fetch_reach_ddpg", ["train.schedule_ranks=4", "replay.size=1000"])
    env = make_env(config.env)
    agent = build_agent(config, env_spec(env, config.env.id), env)  # one rank: a quarter of those it was tuned at
    assert (agent.n_batches, agent.batch_size) == (10, 1024)
    asked = []
    monkeypatch.setattr(agent.buffer, "sample", lambda n, *args, **kwargs: asked.append(n))
    agent.sample_batch()
    assert asked == [1024]


@pytest.mark.parametrize("schedule_ranks, moved_at", [(None, [4, 8]), (2, [4])])
def test_schedule_ranks_moves_the_targets_once_per_tuned_cycle(monkeypatch, schedule_ranks, moved_at):
    # DDPG's targets move once per cycle: at 1 rank a recipe tuned at 2 runs half the updates
    # per cycle (2 of 4), so its targets move every second cycle, after as many updates as at 2 ranks
    from her_mpi.config import load_config
    from her_mpi.envs import env_spec, make_env

    scheduled = [] if schedule_ranks is None else [f"train.schedule_ranks={schedule_ranks}"]
    config = load_config("fetch_reach_ddpg", ["algo.target_update_every=0", "train.n_batches=4", "replay.size=1000",
                                              *scheduled])
    env = make_env(config.env)
    agent = build_agent(config, env_spec(env, config.env.id), env)
    moved = []
    monkeypatch.setattr(agent, "update_targets", lambda: moved.append(agent.n_updates))
    monkeypatch.setattr(agent.buffer, "store", lambda episodes: None)
    monkeypatch.setattr(agent, "update_normalizers", lambda episodes: None)
    monkeypatch.setattr(agent, "sample_batch", dict)
    monkeypatch.setattr(agent, "batch_tensors", lambda batch: {})
    monkeypatch.setattr(agent, "update", lambda tensors: ({"critic_loss": torch.tensor(0.0)}, torch.zeros(0)))
    for _ in range(2):
        agent.learn(episodes=None)
    assert agent.n_updates == 2 * (4 if schedule_ranks is None else 2)
    assert moved == moved_at
