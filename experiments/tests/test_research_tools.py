"""Tests of the research tools (experiments/collect_sweep.py, park_runs.py and the diagnostics).

    python -m pytest experiments/tests

Not part of the package's suite (pytest.ini's testpaths): the package's tests import nothing from
experiments/.
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

from her_mpi.config import load_config
from her_mpi.settings import UnusedSettingWarning

from fake_runs import fake_run

EXPERIMENTS = Path(__file__).resolve().parents[1]


def research_script(name: str):
    """An experiments/ script as a module (experiments/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_collecting_a_sweep_again_keeps_finished_runs_whose_directory_is_gone(tmp_path, capsys):
    collect_sweep = research_script("collect_sweep")
    sweep, stored = tmp_path / "sweeps/pacman", tmp_path / "results/pacman"
    for seed in (0, 1):
        fake_run(sweep / "recipe" / f"seed{seed}", seed, [0.1, 0.2])
        (sweep / "recipe" / f"seed{seed}/finished.json").write_text("{}")
    fake_run(sweep / "recipe/seed2", 2, [0.1])  # still training
    assert collect_sweep.refresh(stored, [sweep], finished_only=True) == 2
    shutil.rmtree(sweep / "recipe/seed0")  # e.g. runs/ lost with the session
    (sweep / "recipe/seed1/progress.csv").write_text((sweep / "recipe/seed1/progress.csv").read_text() + "2,30000,15000,2,0.9,0,90,50\n")
    assert collect_sweep.refresh(stored, [sweep], finished_only=True) == 2
    assert "kept pacman/recipe/seed0" in capsys.readouterr().out
    assert (stored / "pacman/recipe/seed0/progress.csv").read_text().count("\n") == 3  # header + 2 epochs, as stored
    assert (stored / "pacman/recipe/seed1/progress.csv").read_text().endswith(",0.9,0,90,50\n")  # refreshed
    assert not (stored / "pacman/recipe/seed2").exists()
    assert collect_sweep.refresh(stored, [sweep], finished_only=True, drop_missing=True) == 1
    assert not (stored / "pacman/recipe/seed0").exists()
    fake_run(sweep / "other/seed0", 0, [0.3])  # a second recipe in the same sweep, left out by --recipe
    (sweep / "other/seed0/finished.json").write_text("{}")
    assert collect_sweep.refresh(stored, [sweep], finished_only=True, recipes={"recipe"}) == 1
    assert not (stored / "pacman/other").exists()
    # --seed: the held-out seeds only (seed1 of "recipe"; "other" has only seed0)
    assert collect_sweep.refresh(stored, [sweep], finished_only=True, seeds={1}) == 1
    assert (stored / "pacman/recipe/seed1").is_dir() and not (stored / "pacman/other").exists()
    fake_run(tmp_path / "sweeps/np4/recipe/seed0", 0, [0.2])  # a second sweep directory of the same table
    assert collect_sweep.refresh(stored, [sweep, tmp_path / "sweeps/np4"], finished_only=False) == 4
    capsys.readouterr()
    collect_sweep.refresh(stored, [sweep], finished_only=False)
    assert "dropped np4/" in capsys.readouterr().out and not (stored / "np4").exists()
    shutil.rmtree(sweep / "recipe/seed2")  # an unfinished run parked: kept unless only finished runs are asked for
    assert collect_sweep.refresh(stored, [sweep], finished_only=False) == 3
    assert "kept pacman/recipe/seed2: unfinished" in capsys.readouterr().out
    assert collect_sweep.refresh(stored, [sweep], finished_only=True) == 2 and not (stored / "pacman/recipe/seed2").exists()



def test_a_collected_table_names_the_command_that_made_it(tmp_path, monkeypatch):
    collect_sweep = research_script("collect_sweep")
    monkeypatch.setattr(collect_sweep, "RESULTS", tmp_path)
    (tmp_path / "pacman.json").write_text(json.dumps({"recipes": [{"recipe": "r"}]}))
    (tmp_path / "pacman.md").write_text("| recipe |\n|---|\n")
    command = collect_sweep.this_command([str(collect_sweep.ROOT / "runs/sweeps/pacman"), "--name", "pacman",
                                          "--title", "two words", "--at", "300k"])
    assert command == "python experiments/collect_sweep.py runs/sweeps/pacman --name pacman --title 'two words' --at 300k"
    collect_sweep.record_command("pacman", command)
    assert json.loads((tmp_path / "pacman.json").read_text()) == {"recipes": [{"recipe": "r"}], "made_by": command}
    assert (tmp_path / "pacman.md").read_text().endswith(f"|---|\n\nMade by `{command}`.\n")


def test_a_collect_stopped_part_way_leaves_the_stored_runs_as_they_were(tmp_path, monkeypatch):
    collect_sweep = research_script("collect_sweep")
    sweep, stored = tmp_path / "sweeps/pacman", tmp_path / "results/pacman"
    fake_run(sweep / "recipe/seed0", 0, [0.1, 0.2])
    (sweep / "recipe/seed0/finished.json").write_text("{}")
    assert collect_sweep.refresh(stored, [sweep], finished_only=True) == 1
    before = {path.relative_to(stored): path.read_bytes() for path in stored.rglob("*") if path.is_file()}
    shutil.rmtree(sweep / "recipe/seed0")  # gone from the sweep: only the stored copy is left

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(collect_sweep, "copy_runs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        collect_sweep.refresh(stored, [sweep], finished_only=True)
    assert {path.relative_to(stored): path.read_bytes() for path in stored.rglob("*") if path.is_file()} == before
    monkeypatch.undo()
    assert collect_sweep.refresh(stored, [sweep], finished_only=True) == 1  # the next collect cleans up and keeps it
    assert sorted(path.name for path in stored.parent.iterdir()) == ["pacman"]

def test_parking_carries_a_run_without_its_replay_and_unparking_keeps_the_further_copy(tmp_path, monkeypatch, capsys):
    park_runs = research_script("park_runs")
    monkeypatch.setattr(park_runs, "ROOT", tmp_path)
    monkeypatch.setattr(park_runs, "SWEEPS", tmp_path / "runs/sweeps")
    monkeypatch.setattr(park_runs, "PARKED", tmp_path / "experiments/parked")
    run = tmp_path / "runs/sweeps/pacman/dqn/seed2"
    fake_run(run, 2, [0.1, 0.2])
    (run / "checkpoints/replay_rank0").mkdir(parents=True)
    (run / "checkpoints/replay_rank0/segment.npz").write_bytes(b"x" * 100)
    (run / "checkpoints/latest.pt").write_bytes(b"weights at epoch 1")
    assert park_runs.park([tmp_path / "runs/sweeps/pacman"]) == 0
    parked = tmp_path / "experiments/parked/pacman/dqn/seed2"
    assert (parked / "checkpoints/latest.pt").read_bytes() == b"weights at epoch 1"
    assert not (parked / "checkpoints/replay_rank0").exists()  # GBs for an off-policy run: never in git
    assert "has replay buffers, which are not parked" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="not a sweep directory"):
        park_runs.park([tmp_path / "elsewhere"])

    # the run trained on after parking: unpark keeps it; once runs/ is lost, unpark restores the parked copy
    (run / "progress.csv").write_text((run / "progress.csv").read_text() + "2,30000,15000,2,0.9,0,90,50\n")
    assert park_runs.unpark() == 0
    assert "kept runs/sweeps/pacman/dqn/seed2 (epoch 3; parked: 2)" in capsys.readouterr().out
    shutil.rmtree(tmp_path / "runs")
    assert park_runs.unpark() == 0
    assert (run / "checkpoints/latest.pt").read_bytes() == b"weights at epoch 1"
    assert (run / "progress.csv").read_text() == (parked / "progress.csv").read_text()


def test_a_run_measured_again_after_parking_replaces_its_row(tmp_path):
    unseen_eval = research_script("unseen_eval")
    results = tmp_path / "unseen.json"
    row = {"env_id": "FetchPush-v4", "recipe": "fetch_push_htrpo", "seed": 0}
    unseen_eval.merge_rows(results, [{**row, "run": "runs/sweeps/push/fetch_push_htrpo/seed0", "success_rate": 0.1},
                                     {**row, "run": "runs/sweeps/push/fetch_push_htrpo/seed1", "seed": 1}],
                           lambda r: r["seed"])
    rows = unseen_eval.merge_rows(results, [{**row, "run": "experiments/parked/push/fetch_push_htrpo/seed0",
                                             "success_rate": 0.2}], lambda r: r["seed"])
    assert [(r["seed"], r["run"].split("/")[0]) for r in rows] == [(0, "experiments"), (1, "runs")]
    assert rows[0]["success_rate"] == 0.2


def test_the_pacman_authors_recipe_is_the_screened_lever():
    """ms_pacman_goal_htrpo_authors's evidence is the authors_bonus10 lever's runs (experiments/tables.sh
    ms_pacman_htrpo_levers trained on to 2M): the recipe must train what that lever trains."""
    command = subprocess.run(["bash", str(EXPERIMENTS / "tables.sh"), "ms_pacman_htrpo_levers"], check=True,
                             capture_output=True, text=True, env={**os.environ, "DRY_RUN": "1", "LEVERS": "authors_bonus10",
                                                                  "SEEDS": "0", "MAX_STEPS": "2000000"}).stdout.split()
    lever = [command[i + 1] for i, word in enumerate(command) if word == "--set"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedSettingWarning)  # the critic's settings with algo.critic=false
        screened = dataclasses.asdict(load_config(EXPERIMENTS.parent / "configs" / "ms_pacman_goal_htrpo.yaml", lever))
        recipe = dataclasses.asdict(load_config(EXPERIMENTS.parent / "configs" / "ms_pacman_goal_htrpo_authors.yaml"))
    for settings in (screened, recipe):  # settings of the critic, which neither trains
        for key in ("lr_critic", "critic_iters"):
            settings["algo"].pop(key)
    assert screened == recipe


def test_early_signals_average_each_span_and_mark_spans_a_run_has_not_reached(tmp_path):
    early_signals = research_script("early_signals")
    long, short = tmp_path / "long", tmp_path / "short"
    fake_run(long, 0, [0.1, 0.2, 0.3, 0.4])  # 10k ... 40k env steps
    fake_run(short, 1, [0.5])
    (long / "sweep.json").write_text('{"recipe": "fetch_push_td3", "overrides": ["algo.init=orthogonal", '
                                     '"train.n_epochs=4"]}')
    summaries = [early_signals.summarise(run, [20_000, 40_000]) for run in (long, short)]
    assert summaries[0]["label"] == "fetch_push_td3 algo.init=orthogonal"  # budget keys left out
    assert [s["test_success"] for s in summaries[0]["spans"]] == [0.15, 0.35]
    assert [s["complete"] for s in summaries[1]["spans"]] == [False, False]
    assert summaries[1]["spans"][1]["test_success"] is None  # nothing logged there yet
    table = early_signals.markdown(summaries, [20_000, 40_000])
    assert "| fetch_push_td3 algo.init=orthogonal | 40k | 0.00 | 0.15 | 0.00 | 0.35 |" in table
    assert "0.50*" in table


def test_the_log_ratio_clip_measure_compares_clipped_with_unclipped_weights_and_restores_the_clip():
    log_ratio_clip = research_script("log_ratio_clip")
    params = types.SimpleNamespace(max_log_ratio=20.0)
    limit = params.max_log_ratio
    # one original episode (row 0) and two hindsight copies of 3 steps: copy 1 climbs past +limit at its last step
    data = types.SimpleNamespace(mask=np.ones((3, 3), bool))
    copy, t = np.repeat(np.arange(3), 3), np.tile(np.arange(3), 3)
    log_ratio = np.array([0, 0, 0, limit / 2, limit / 2, 1.0, -1.0, 0, 0])

    def weights(data, copy, t, log_ratio, n_original, n_goals):  # plain per-decision ratios, clipped as training does
        grid = np.zeros(data.mask.shape)
        grid[copy, t] = log_ratio
        grid[:n_original] = 0
        return np.exp(np.clip(np.cumsum(grid, axis=1), -params.max_log_ratio, params.max_log_ratio))[copy, t]

    clipped, measures = log_ratio_clip.batch_measures(weights, params, data, copy, t, log_ratio, 1, 2, caps=(1.0,))
    assert params.max_log_ratio == limit
    assert np.allclose(clipped, weights(data, copy, t, log_ratio, 1, 2))
    assert measures["rows"] == 6 and measures["above_clip"] == 1 / 6 and measures["below_clip"] == 0
    assert measures["log_ratio_max"] == limit + 1
    assert 0 < measures["weights_l1_change"] < 1 and measures["ess_clipped"] > measures["ess_unclipped"]
    # at a clip of 1 copy 1's cumulative log ratios (10, 20, 21) weigh e^1 each, copy 2's (-1 each) e^-1
    expected = np.exp([1, 1, 1, -1, -1, -1])
    assert np.isclose(measures["ess_at_cap"]["1.0"], expected.sum() ** 2 / (expected ** 2).sum())


def test_widening_an_exported_policys_input_clip_changes_only_inputs_beyond_the_old_clip(tmp_path):
    from her_mpi_runtime import Policy

    object_contact = research_script("object_contact")
    trained, widened = Policy("zoo:fetch_pick_and_place"), Policy(
        object_contact.widen_input_clip("zoo:fetch_pick_and_place", 20.0, str(tmp_path)))
    meta = trained.metadata
    obs, goal = np.zeros(meta.obs_dim, np.float32), np.zeros(meta.goal_dim, np.float32)
    obs[:6] = [1.34, 0.75, 0.49, 1.34, 0.75, 0.43]  # gripper above the object on the table
    goal[:] = [1.34, 0.75, 0.60]
    assert np.allclose(trained.act(obs, goal), widened.act(obs, goal))
    obs[5] = 1.0  # the object ~11 std above its mean height: past the trained clip of 5
    assert not np.allclose(trained.act(obs, goal), widened.act(obs, goal))


def test_contact_rows_join_an_earlier_file_only_on_the_same_episodes_and_cpu_model(tmp_path, monkeypatch):
    object_contact = research_script("object_contact")
    here = {"cpu": "AMD EPYC", "cpu_kernels": "AVX512"}
    monkeypatch.setattr(object_contact, "RESULTS", tmp_path)
    monkeypatch.setattr(object_contact, "machine", lambda: here)
    rows = [{"policy": "seed 0 at 336k env steps", "success": 0.0}]
    (tmp_path / "contact.json").write_text(json.dumps({"machine": here, "episodes": 200, "seed": 1000,
                                                       "policies": rows}))
    assert object_contact.earlier_rows("contact", 200, 1000) == rows
    with pytest.raises(SystemExit, match="200 episodes from seed 1000, not 40 from seed 1000"):
        object_contact.earlier_rows("contact", 40, 1000)
    with pytest.raises(SystemExit, match="does not exist"):
        object_contact.earlier_rows("other", 200, 1000)
    with pytest.raises(SystemExit, match="needs --name"):
        object_contact.earlier_rows(None, 200, 1000)
    monkeypatch.setattr(object_contact, "machine", lambda: {**here, "cpu_kernels": "AVX2"})
    with pytest.raises(SystemExit, match="AVX512.*AVX2.*new --name"):
        object_contact.earlier_rows("contact", 200, 1000)


def test_a_resume_clock_counts_seconds_per_env_step_of_the_epochs_after_the_first_resumed_one():
    resume_clock = research_script("resume_clock")
    phases = {"time_rollout_s": 1.0, "time_learn_s": 8.0, "time_eval_s": 1.0}
    stored = [{"env_steps": 90_000, "time_s": 4_000.0, "test_success_rate": 0.7, **phases}]
    # the first resumed epoch finishes cycles begun before the stop: its 1,000 s are not the variant's
    trained = [{"env_steps": 100_000, "time_s": 5_000.0, "test_success_rate": 0.8, **phases},
               {"env_steps": 102_000, "time_s": 5_010.0, "test_success_rate": 0.8, **phases},
               {"env_steps": 105_000, "time_s": 5_020.0, "test_success_rate": 0.9, **phases}]
    summary = resume_clock.summarise(*resume_clock.resumed_rows(stored + trained, 1, 3))
    assert summary["env_steps"] == 5_000 and summary["epochs"] == 2 and summary["from_env_steps"] == 100_000
    assert summary["s_per_1k_steps"] == 4.0  # 20 s over 5k steps
    assert summary["phase_s_per_1k_steps"] == {"time_rollout_s": 0.4, "time_learn_s": 3.2, "time_eval_s": 0.4}
    with pytest.raises(RuntimeError, match="expected 5 progress rows .* found 4"):
        resume_clock.resumed_rows(stored + trained, 1, 4)  # a job that stopped early (e.g. at a success target)


def test_a_resume_clock_variant_names_a_directory_and_whole_overrides():
    resume_clock = research_script("resume_clock")
    assert resume_clock.variant("rows=algo.critic_batch_size=8192,algo.hidden=[256,256]") == (
        "rows", ["algo.critic_batch_size=8192", "algo.hidden=[256,256]"])
    assert resume_clock.variant("recipe=") == ("recipe", [])
    for bad in ("algo.critic_batch_size", "algo.critic_batch_size=8192", "../sweeps=", "rows=critic_batch_size=8192"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected LABEL="):
            resume_clock.variant(bad)


def test_unseen_eval_calls_a_run_finished_only_at_its_recipes_budget(tmp_path):
    # EPOCHS=N caps write finished.json too; the results table must not read a capped run as done
    unseen_eval = research_script("unseen_eval")
    budget = load_config("fetch_push_td3").train.n_epochs
    for name, epochs in (("capped", budget - 1), ("full", budget)):
        fake_run(tmp_path / name, 0, [0.0] * epochs)
        (tmp_path / name / "finished.json").write_text("{}")
    assert not unseen_eval.at_recipe_budget(tmp_path / "capped", "fetch_push_td3")
    assert unseen_eval.at_recipe_budget(tmp_path / "full", "fetch_push_td3")
    assert unseen_eval.at_recipe_budget(tmp_path / "capped", None)  # no recipe known: finished.json decides
    (tmp_path / "full" / "finished.json").unlink()  # stopped at the budget, never closed: not finished
    assert not unseen_eval.at_recipe_budget(tmp_path / "full", "fetch_push_td3")


def test_a_fine_tune_refuses_a_branch_point_the_parked_run_is_not_at(tmp_path):
    # htrpo_push_hold_1m branches at epoch 63; a seed never parked (epoch 0) must stop before any training starts
    result = subprocess.run(["bash", str(EXPERIMENTS / "tables.sh"), "htrpo_push_hold_1m"], capture_output=True,
                            text=True, env={**os.environ, "SWEEP_OUT": str(tmp_path / "out"), "SEEDS": "97"})
    assert result.returncode == 2
    assert "at epoch 63, which is at epoch 0" in result.stderr
    assert not (tmp_path / "out").exists()


def test_park_runs_counts_a_runs_epochs(tmp_path, capsys):
    fake_run(tmp_path / "run", 0, [0.1, 0.2, 0.3])
    park_runs = research_script("park_runs")
    assert park_runs.main(["epochs", str(tmp_path / "run")]) == 0
    assert park_runs.main(["epochs", str(tmp_path / "missing")]) == 0
    assert capsys.readouterr().out.split() == ["3", "0"]
