"""The evidence instrument: independent seeds, the resumable sweep runner, and aggregation over
seeds (IQM with a stratified bootstrap interval, steps to a threshold)."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from helpers import ROOT, describe, mpi_env, read_progress, run_mpi
from fake_runs import fake_run
from her_mpi import plot
from her_mpi.config import ConfigError, load_config
from her_mpi.sweep import parse_seeds
from her_mpi.trainer import rank_seeds


def stream_fingerprints(seed: int, n_ranks: int) -> list[tuple]:
    return [tuple(sequence.generate_state(4)) for rank in range(n_ranks)
            for sequence in rank_seeds(seed, rank).values()]


def test_two_seeds_at_two_ranks_share_no_stream():
    # (a scheme of SeedSequence(seed + rank) would give seed 1's rank 0 the streams of seed 0's rank 1)
    streams = stream_fingerprints(0, 2) + stream_fingerprints(1, 2)
    assert len(streams) == 12 and len(set(streams)) == 12


@pytest.mark.parametrize("n_ranks", [1, 2, 3, 8])
def test_no_two_seed_rank_pairs_share_a_stream_for_any_rank_count(n_ranks):
    streams = [s for seed in range(6) for s in stream_fingerprints(seed, n_ranks)]
    assert len(set(streams)) == len(streams)


def test_a_rank_keeps_its_streams_whatever_the_rank_count():
    assert stream_fingerprints(3, 2) == stream_fingerprints(3, 8)[:6]


def test_seed_ranges():
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("0,3, 7") == [0, 3, 7]
    assert parse_seeds("0-2,5,1") == [0, 1, 2, 5]
    for bad in ("4-1", "a", "-1", "", "1-", "0-2,x"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)


def test_test_episodes_are_a_total_over_ranks():
    train = load_config(None).train
    assert train.n_test_episodes == 50
    assert [train.test_episodes_per_rank(n) for n in (1, 2, 3, 8)] == [50, 25, 17, 7]
    with pytest.warns(FutureWarning, match="n_test_episodes"):
        legacy = load_config(None, ["train.n_test_rollouts=4"]).train
    assert legacy.test_episodes_per_rank(2) == 4


# -- the sweep runner, with real mpirun --------------------------------------------------------

TINY_SWEEP = ["--config", "fetch_reach_td3", "--np", "2", "--set", "train.n_cycles=2",
              "--set", "train.n_batches=3", "--set", "train.batch_size=32",
              "--set", "train.n_test_episodes=4", "--set", "log.tensorboard=false"]


def sweep(out, *args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "her_mpi.sweep", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=timeout, env=mpi_env(), cwd=ROOT)


@pytest.mark.mpi
def test_sweep_skips_finished_runs_and_resumes_interrupted_ones(tmp_path):
    out = tmp_path / "sweep"
    first = sweep(out, *TINY_SWEEP, "--seeds", "0-1", "--set", "train.n_epochs=1")
    assert first.returncode == 0, describe(first)
    assert first.stdout.count("test success") == 2 and "[2/2]" in first.stdout and "ETA" in first.stdout
    for seed in (0, 1):
        run_dir = out / "fetch_reach_td3" / f"seed{seed}"
        assert json.loads((run_dir / "finished.json").read_text())["seed"] == seed
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["seed"] == seed

    again = sweep(out, *TINY_SWEEP, "--seeds", "0-1", "--set", "train.n_epochs=1")
    assert again.returncode == 0 and "2 already finished" in again.stdout and "starting" not in again.stdout

    # a longer budget: both runs are now unfinished and continue from their checkpoints
    before = read_progress(out / "fetch_reach_td3" / "seed0")
    longer = sweep(out, *TINY_SWEEP, "--seeds", "0-1", "--set", "train.n_epochs=2")
    assert longer.returncode == 0, describe(longer)
    assert "2 to resume" in longer.stdout and longer.stdout.count("resuming") == 2
    rows = read_progress(out / "fetch_reach_td3" / "seed0")
    assert [int(r["epoch"]) for r in rows] == [0, 1] and rows[0] == before[0]
    assert int(rows[1]["updates"]) == 2 * int(rows[0]["updates"])  # counters carried over


@pytest.mark.mpi
def test_a_run_capped_earlier_trains_on_to_the_recipes_budget(tmp_path):
    recipe = tmp_path / "tiny.yaml"  # the recipe's own budget: 2 epochs
    recipe.write_text(f"inherit: {ROOT / 'configs' / 'fetch_reach_td3.yaml'}\ntrain: {{n_epochs: 2}}\n")
    tiny = [*TINY_SWEEP[2:], "--config", str(recipe), "--seeds", "0"]
    capped = sweep(tmp_path / "sweep", *tiny, "--set", "train.n_epochs=1")
    assert capped.returncode == 0, describe(capped)
    uncapped = sweep(tmp_path / "sweep", *tiny)  # no cap: the recipe's 2 epochs
    assert uncapped.returncode == 0 and "resuming" in uncapped.stdout, describe(uncapped)
    assert [int(r["epoch"]) for r in read_progress(tmp_path / "sweep" / "tiny" / "seed0")] == [0, 1]


@pytest.mark.mpi
def test_a_budget_in_env_steps_ends_runs_and_sweeps(tmp_path):
    # 2 ranks x 2 cycles x 2 episodes x 50 steps = 400 env steps per epoch; n_epochs is only a cap
    out, run_dir = tmp_path / "sweep", tmp_path / "sweep" / "fetch_reach_td3" / "seed0"
    first = sweep(out, *TINY_SWEEP, "--seeds", "0", "--set", "train.n_epochs=5", "--set", "train.max_env_steps=700")
    assert first.returncode == 0 and "[1/1]" in first.stdout, describe(first)
    assert [int(r["env_steps"]) for r in read_progress(run_dir)] == [400, 800]
    again = sweep(out, *TINY_SWEEP, "--seeds", "0", "--set", "train.n_epochs=5", "--set", "train.max_env_steps=700")
    assert "1 already finished" in again.stdout and "starting" not in again.stdout, describe(again)
    longer = sweep(out, *TINY_SWEEP, "--seeds", "0", "--set", "train.n_epochs=5", "--set", "train.max_env_steps=1100")
    assert longer.returncode == 0 and "resuming" in longer.stdout, describe(longer)
    assert [int(r["env_steps"]) for r in read_progress(run_dir)] == [400, 800, 1200]
    # a resume that already has its budget trains nothing
    spent = run_mpi(2, ["-m", "her_mpi.train", "--resume", run_dir, "--set", "train.max_env_steps=1000"])
    assert spent.returncode == 0 and "reached train.max_env_steps = 1,000" in spent.stdout, describe(spent)
    assert len(read_progress(run_dir)) == 3


@pytest.mark.mpi
def test_sweep_stopped_mid_run_resumes_where_it_was(tmp_path):
    out = tmp_path / "sweep"
    args = [*TINY_SWEEP, "--seeds", "0", "--set", "train.n_epochs=30"]
    process = subprocess.Popen([sys.executable, "-m", "her_mpi.sweep", "--out", str(out), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env(), cwd=ROOT)
    run_dir = out / "fetch_reach_td3" / "seed0"
    try:  # wait for two checkpointed epochs, then stop the sweep (SIGUSR1 stops it like Ctrl-C)
        deadline = time.monotonic() + 600
        while process.poll() is None and time.monotonic() < deadline:
            if (run_dir / "progress.csv").is_file() and len(read_progress(run_dir)) >= 2:
                break
            time.sleep(0.5)
        process.send_signal(signal.SIGUSR1)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert "run the same command again" in stderr
    # the job was stopped gracefully (its ranks checkpointed and exited 75), not killed
    assert "exited with 75" not in stderr and "FAILED" not in stderr
    assert "stopped" in (out / "logs" / "fetch_reach_td3_seed0.log").read_text().split("===")[-1]
    done = len(read_progress(run_dir))
    assert 2 <= done < 30 and not (run_dir / "finished.json").exists()
    past = sweep(out, *TINY_SWEEP, "--seeds", "0", "--set", f"train.n_epochs={done - 1}")  # a smaller budget
    assert past.returncode == 0 and "stopped past this budget" in past.stdout, describe(past)
    assert "resuming" not in past.stdout and len(read_progress(run_dir)) == done
    resumed = sweep(out, *TINY_SWEEP, "--seeds", "0", "--set", f"train.n_epochs={done + 1}")
    assert resumed.returncode == 0, describe(resumed)
    assert "resuming" in resumed.stdout
    assert [int(r["epoch"]) for r in read_progress(run_dir)] == list(range(done + 1))


def training_ranks(run_dir) -> list[int]:
    """The pids of the her_mpi.train ranks writing into ``run_dir`` (not mpirun, not the launcher)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode().split("\0")
        except OSError:
            continue
        if argv[1:3] == ["-m", "her_mpi.train"] and str(run_dir) in argv:
            found.append(int(cmdline.parent.name))
    return found


@pytest.mark.mpi
def test_a_job_that_loses_a_rank_is_resumed_at_once_and_finishes(tmp_path):
    out = tmp_path / "sweep"
    process = subprocess.Popen([sys.executable, "-m", "her_mpi.sweep", "--out", str(out), *TINY_SWEEP, "--seeds", "0",
                                "--set", "train.n_epochs=6"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env(), cwd=ROOT)
    run_dir = out / "fetch_reach_td3" / "seed0"
    try:
        deadline = time.monotonic() + 300
        while process.poll() is None and time.monotonic() < deadline:
            if (run_dir / "progress.csv").is_file() and len(read_progress(run_dir)) >= 2 and training_ranks(run_dir):
                break
            time.sleep(0.2)
        os.kill(training_ranks(run_dir)[-1], signal.SIGKILL)  # like a node's OOM killer
        stdout, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 0, f"{stdout}\n{stderr}"
    assert "lost a host or rank" in stderr and "resuming it from its last checkpoint" in stderr
    assert [int(r["epoch"]) for r in read_progress(run_dir)] == list(range(6))
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"


@pytest.mark.parametrize("args, message", [
    (["--config", "fetch_push_tdd3"], "did you mean fetch_push_td3"),
    (["--config", "fetch_push_td3", "--seeds", "3-1"], "--seeds '3-1'"),
    (["--config", "fetch_push_td3", "--np", "0"], "--np 0"),
    (["--config", "fetch_push_td3", "--parallel", "0"], "--parallel 0"),
    (["--config", "fetch_push_td3", "--retries", "-1"], "--retries -1"),
    (["--config", "fetch_push_td3", "--set", "train.n_epoch=3"], "did you mean 'train.n_epochs'"),
    (["--config", "fetch_push_td3", "--set", "train.stop_success=0.9"], "compares runs at equal budgets"),
])
def test_sweep_rejects_bad_input_before_anything_starts(tmp_path, args, message):
    result = sweep(tmp_path / "out", *args)
    assert result.returncode == 2 and message in result.stderr
    assert not (tmp_path / "out").exists()


def test_sweep_refuses_a_file_as_its_output_and_plans_a_repeated_recipe_once(tmp_path):
    (tmp_path / "out").write_text("kept")
    result = sweep(tmp_path / "out", "--config", "fetch_push_td3")
    assert result.returncode == 2 and "is a file: expected the directory the runs go to" in result.stderr
    assert (tmp_path / "out").read_text() == "kept"
    result = sweep(tmp_path / "runs", "--config", "bitflip_8_htrpo", "--config", "bitflip_8_htrpo", "--seeds", "0",
                   "--dry-run")
    assert result.returncode == 0 and len(result.stdout.splitlines()) == 1, result.stdout


# -- aggregation -------------------------------------------------------------------------------



def test_the_eta_ignores_an_epoch_stalled_by_a_pause(tmp_path):
    from her_mpi.sweep import Run, Sweep
    run = Run("fetch_push_td3", "fetch_push_td3", 0, tmp_path / "seed0", n_epochs=10)
    assert run.seconds_per_epoch() is None  # nothing measured yet
    fake_run(run.run_dir, 0, [0.0] * 4)  # epochs of 30 s each
    rows = (run.run_dir / "progress.csv").read_text().splitlines()
    rows[3] = rows[3].replace(",90.0,", ",1290.0,")  # the third epoch held up by a 20-minute pause
    rows[4] = rows[4].replace(",120.0,", ",1320.0,")
    (run.run_dir / "progress.csv").write_text("\n".join(rows) + "\n")
    assert run.seconds_per_epoch() == pytest.approx(30.0)
    assert Sweep([run], n_ranks=2, parallel=1, log_dir=tmp_path).eta() == pytest.approx(6 * 30.0)


def test_runs_written_by_another_version_of_the_package_still_group_together(tmp_path):
    """A run resumed into a newer version keeps its old config.yaml: keys added since (at their
    defaults) and renamed keys must not split a recipe's seeds into two curves."""
    fake_run(tmp_path / "new/seed0", 0, [0.0, 0.5])
    fake_run(tmp_path / "old/seed1", 1, [0.0, 0.7])
    old = yaml.safe_load((tmp_path / "old/seed1/config.yaml").read_text())
    del old["algo"]["kfac"]["split_preconditioning"]  # a key this version added, at its default
    (tmp_path / "old/seed1/config.yaml").write_text(yaml.safe_dump(old))
    recipes = plot.group(plot.find_runs([tmp_path]))
    assert [len(r.runs) for r in recipes] == [2]


def test_runs_that_differ_only_in_their_budget_group_together(tmp_path):
    """A recipe's seeds run with another epoch or env-step cap (e.g. one inherited and never reached)
    are the same recipe: the curve stops where every seed has data."""
    fake_run(tmp_path / "a/seed0", 0, [0.0, 0.5])
    fake_run(tmp_path / "b/seed1", 1, [0.0, 0.7, 0.8])
    config = yaml.safe_load((tmp_path / "b/seed1/config.yaml").read_text())
    config["train"].update(n_epochs=40, max_env_steps=2_000_000)
    (tmp_path / "b/seed1/config.yaml").write_text(yaml.safe_dump(config))
    (recipe,) = plot.group(plot.find_runs([tmp_path]))
    assert len(recipe.runs) == 2 and plot.summarise(recipe, reps=200)["epochs"] == 2


FINALS = [0.0, 0.2, 0.4, 0.6, 1.0]


def test_runs_of_one_recipe_become_one_curve_with_the_known_iqm(tmp_path):
    for seed, final in enumerate(FINALS):
        fake_run(tmp_path / f"a/seed{seed}", seed, [0.0, final / 2, final])
    fake_run(tmp_path / "b/seed0", 0, [0.0, 0.5, 0.9], lr=3e-4)  # another setting: another curve
    recipes = plot.group(plot.find_runs([tmp_path]))
    assert sorted(len(r.runs) for r in recipes) == [1, 5]
    five = next(r for r in recipes if len(r.runs) == 5)
    summary = plot.summarise(five, reps=4000)
    assert summary["iqm_success"] == pytest.approx(0.4)  # mean of the middle three of five
    assert summary["curve"]["iqm"] == pytest.approx([0.0, 0.2, 0.4])
    assert summary["seeds"] == [0, 1, 2, 3, 4] and summary["n_ranks"] == 2

    # the interval is the bootstrap over seeds of the IQM: recompute it independently
    rng = np.random.default_rng(1)
    resampled = rng.choice(np.array(FINALS), size=(20_000, 5), replace=True)
    expected = np.percentile(stats.trim_mean(resampled, 0.25, axis=1), [2.5, 97.5])
    assert summary["ci95"] == pytest.approx(expected, abs=0.04)
    assert summary["ci95"][0] < 0.4 < summary["ci95"][1]
    assert summary["seconds_per_100k_env_steps"] == pytest.approx(300.0)
    assert summary["test_episodes_per_eval"] == 50


def test_the_interval_does_not_depend_on_numpys_global_generator():
    # rliable resamples with np.random's global state: before the fix, these seeds moved the lower
    # bound between 0.067 and 0.133 (the test above failed in the full suite, passed alone)
    scores = np.array([[0.0, f / 2, f] for f in FINALS])[:, None, :]
    intervals = []
    for global_seed in (0, 18, 35, 61):
        np.random.seed(global_seed)
        before = np.random.get_state()[1].copy()
        intervals.append(plot.iqm_curve(scores, reps=4000)[1][:, -1])
        assert np.array_equal(np.random.get_state()[1], before)  # and the caller's stream is left alone
    assert all(np.array_equal(interval, intervals[0]) for interval in intervals)


def test_identical_seeds_give_a_zero_width_interval(tmp_path):
    for seed in range(3):
        fake_run(tmp_path / f"seed{seed}", seed, [0.1, 0.7])
    (recipe,) = plot.group(plot.find_runs([tmp_path]))
    summary = plot.summarise(recipe, reps=500)
    assert summary["ci95"] == pytest.approx([0.7, 0.7])


def test_steps_to_threshold_is_the_first_crossing_of_the_aggregate_curve():
    steps = np.array([10, 20, 30, 40, 50])
    curve = np.array([0.1, 0.55, 0.45, 0.85, 0.95])
    assert plot.first_crossing(steps, curve, 0.5) == 20
    assert plot.first_crossing(steps, curve, 0.8) == 40
    assert plot.first_crossing(steps, curve, 0.9) == 50
    assert plot.first_crossing(steps, curve, 0.99) is None


def test_aggregate_uses_the_epochs_every_seed_reached(tmp_path):
    fake_run(tmp_path / "seed0", 0, [0.2, 0.4, 0.9])
    fake_run(tmp_path / "seed1", 1, [0.2, 0.6])
    (recipe,) = plot.group(plot.find_runs([tmp_path]))
    summary = plot.summarise(recipe, reps=500)
    assert summary["epochs"] == 2 and summary["epochs_per_seed"] == [3, 2]
    assert summary["budget_env_steps"] == 20_000


def test_iqm_at_an_earlier_budget_reads_the_last_evaluation_before_it(tmp_path):
    for seed, final in enumerate(FINALS):
        fake_run(tmp_path / f"seed{seed}", seed, [0.0, final / 2, final])  # 10k, 20k, 30k env steps
    (recipe,) = plot.group(plot.find_runs([tmp_path]))
    summary = plot.summarise(recipe, reps=500, at=(20_000, 25_000, 30_000, 40_000))
    at = {a["budget_env_steps"]: a for a in summary["at"]}
    assert at[20_000]["iqm_success"] == pytest.approx(0.2) and at[20_000]["env_steps"] == 20_000
    assert at[25_000]["env_steps"] == 20_000  # the evaluation at or before the budget, never after
    assert at[30_000]["iqm_success"] == pytest.approx(summary["iqm_success"])
    assert at[20_000]["ci95"][0] <= 0.2 <= at[20_000]["ci95"][1]
    assert at[40_000]["iqm_success"] is None  # the runs stop short of it: no number is made up
    assert "| IQM at 20k | IQM at 25k | IQM at 30k | IQM at 40k |" in plot.markdown_table([summary])
    assert "runs too short" in plot.markdown_table([summary])


def fake_runs_with_env_steps(folder, seeds):
    """Runs of one recipe whose evaluations fall at the given env steps: [(test success, env steps)] per seed."""
    for seed, (success, steps) in enumerate(seeds):
        fake_run(folder / f"seed{seed}", seed, success)
        rows = [line.split(",") for line in (folder / f"seed{seed}/progress.csv").read_text().splitlines()]
        rows = rows[:1] + [row[:1] + [str(n)] + row[2:] for row, n in zip(rows[1:], steps)]
        (folder / f"seed{seed}/progress.csv").write_text("\n".join(",".join(row) for row in rows) + "\n")
    (recipe,) = plot.group(plot.find_runs([folder]))
    return recipe


def test_seeds_that_ran_equal_epoch_counts_are_compared_epoch_by_epoch(tmp_path):
    # an epoch budget: seeds whose episodes end at different lengths are read at the same epochs
    recipe = fake_runs_with_env_steps(tmp_path, [([0.1, 0.5, 0.8], [10_000, 20_000, 30_000]),
                                                 ([0.1, 0.3, 0.6], [8_000, 15_000, 22_000])])
    summary = plot.summarise(recipe, reps=200)
    assert summary["curve"]["env_steps"] == [9_000, 17_500, 26_000]  # the seeds' mean at each epoch
    assert summary["curve"]["iqm"] == pytest.approx([0.1, 0.4, 0.7])


def test_seeds_that_need_different_epoch_counts_are_aligned_on_env_steps(tmp_path):
    # episodes that end early make epochs uneven: seed 0 reaches 30k in 3 epochs, seed 1 needs 4 epochs of
    # ~7.5k; aligned on epoch index the curve would stop at 3 epochs (mean 26k), short of the 30k both had
    recipe = fake_runs_with_env_steps(tmp_path, [([0.1, 0.5, 0.8], [10_000, 20_000, 30_000]),
                                                 ([0.1, 0.2, 0.3, 0.6], [7_600, 15_100, 22_600, 29_950])])
    summary = plot.summarise(recipe, reps=500, at=(30_000, 20_000))
    assert summary["budget_env_steps"] == 29_950  # the last step both seeds reached
    assert summary["curve"]["env_steps"] == [10_000, 15_100, 20_000, 22_600, 29_950]  # both seeds' evaluations
    # each seed at its last evaluation at or before every step: seed 0 (0.1, 0.1, 0.5, 0.5, 0.5), seed 1
    # (0.1, 0.2, 0.2, 0.3, 0.6); two seeds' IQM is their mean
    assert summary["curve"]["iqm"] == pytest.approx([0.1, 0.15, 0.35, 0.4, 0.55])
    assert len(summary["curve"]["ci95_low"]) == len(summary["curve"]["ci95_high"]) == 5
    assert summary["steps_to_0.5"] == 29_950 and summary["steps_to_0.8"] is None  # read off the aligned curve
    at = {a["budget_env_steps"]: a for a in summary["at"]}
    assert at[30_000]["iqm_success"] == pytest.approx(0.7)  # seeds' last evaluations: 0.8 and 0.6
    assert at[30_000]["env_steps"] == 29_975
    assert at[20_000]["iqm_success"] == pytest.approx(0.35)  # 0.5 at 20k and 0.2 at 15.1k (22.6k is after)


def test_seeds_whose_evaluations_do_not_overlap_yet_are_compared_epoch_by_epoch(tmp_path):
    # a sweep just started: one seed's first evaluation comes after the other's last; no env step has both
    recipe = fake_runs_with_env_steps(tmp_path, [([0.1], [15_000]), ([0.2, 0.4], [7_000, 14_000])])
    summary = plot.summarise(recipe, reps=200)
    assert summary["curve"]["env_steps"] == [11_000] and summary["curve"]["iqm"] == pytest.approx([0.15])


def test_span_means_average_each_seeds_evaluations_between_the_edges(tmp_path):
    fake_run(tmp_path / "seed0", 0, [0.1, 0.3, 0.5, 0.7, 0.9])  # at 10k, 20k, ..., 50k env steps
    fake_run(tmp_path / "seed1", 1, [0.0, 0.2])  # stopped at 20k
    (recipe,) = plot.group(plot.find_runs([tmp_path]))
    spans = plot.summarise(recipe, reps=200, spans=(20_000, 40_000, 60_000))["spans"]
    assert [s["evaluations"] for s in spans["0"]] == [1, 2, 2, 0]  # [0, 20k), [20k, 40k), [40k, 60k), [60k, end]
    assert [s["test"] for s in spans["0"][:3]] == pytest.approx([0.1, 0.4, 0.8]) and spans["0"][3]["test"] is None
    assert spans["0"][1]["train"] == 0.0 and spans["1"][2]["test"] is None  # the run never got there: no number
    # the last span runs to the run's end, past the last edge
    summary = plot.summarise(recipe, reps=200, spans=(20_000, 40_000))
    assert summary["spans"]["0"][2] == {"from": 40_000, "to": None, "evaluations": 2, "test": pytest.approx(0.8),
                                        "train": 0.0}
    table = plot.span_table([summary])
    assert "| < 20k | 20k-40k | >= 40k |" in table
    assert "| 0.10 / 0.00 (1) | 0.40 / 0.00 (2) | 0.80 / 0.00 (2) |" in table
    assert "| 0.00 / 0.00 (1) | 0.20 / 0.00 (1) | - |" in table
    assert plot.span_table([plot.summarise(recipe, reps=200)]) == ""  # no --spans: no table


def test_span_means_leave_out_missing_values(tmp_path):
    fake_run(tmp_path / "seed0", 0, [0.2, 0.4, 0.6])
    rows = (tmp_path / "seed0/progress.csv").read_text().splitlines()
    header = rows[0].split(",")
    blank = [",".join("" if key == "train_success_rate" else value for key, value in zip(header, row.split(",")))
             for row in rows[1:]]
    (tmp_path / "seed0/progress.csv").write_text("\n".join([rows[0], *blank]) + "\n")  # no train success logged
    (recipe,) = plot.group(plot.find_runs([tmp_path]))
    summary = plot.summarise(recipe, reps=200, spans=(20_000,))
    assert [(s["test"], s["train"]) for s in summary["spans"]["0"]] == [(0.2, None), (pytest.approx(0.5), None)]
    assert "| 0.20 (1) | 0.50 (2) |" in plot.span_table([summary])  # test only


def test_plot_names_bad_span_edges(tmp_path, capsys):
    fake_run(tmp_path / "seed0", 0, [0.2, 0.4])
    with pytest.raises(SystemExit) as exit:
        plot.main([str(tmp_path), "-o", str(tmp_path / "c.png"), "--spans", "500k,250k"])
    assert exit.value.code == 2 and not (tmp_path / "c.png").exists()
    assert "--spans" in (error := capsys.readouterr().err) and "500k,250k" in error, error


def test_plot_refuses_bad_paths_before_it_writes_anything(tmp_path, capsys):
    fake_run(tmp_path / "seed0", 0, [0.2, 0.4])
    kept = tmp_path / "kept.png"
    kept.write_bytes(b"an earlier plot")
    (tmp_path / "a_file").write_text("")
    cases = [([str(tmp_path / "nope")], "'" + str(tmp_path / "nope") + "' does not exist"),
             ([str(tmp_path), "-o", str(tmp_path / "c.txt")], "expected an image file name ending in one of"),
             ([str(tmp_path), "-o", str(tmp_path / "seed0")], "expected an image file name"),
             ([str(tmp_path), "-o", str(kept), "--table", str(tmp_path / "a_file" / "table")],
              "--table: cannot make its folder")]
    for args, message in cases:
        with pytest.raises(SystemExit) as exit:
            plot.main(args)
        assert exit.value.code == 2 and message in capsys.readouterr().err, args
    assert kept.read_bytes() == b"an earlier plot" and not (tmp_path / "c.txt").exists()
    assert plot.main([str(tmp_path), "-o", str(tmp_path / "curve")]) == 0  # no suffix: a PNG, as savefig names it
    assert (tmp_path / "curve.png").is_file()


@pytest.mark.parametrize("text", ["500k,250k", "250k,250k", "250k,x"])
def test_span_edges_must_increase(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected"):
        plot.parse_span_edges(text)


@pytest.mark.parametrize("text, steps", [("300000", 300_000), ("300_000", 300_000), ("300k", 300_000),
                                         ("1.5M", 1_500_000), ("2m", 2_000_000)])
def test_env_step_budgets_parse_with_suffixes(text, steps):
    assert plot.parse_env_steps(text) == steps


@pytest.mark.parametrize("text", ["3x", "", "-5k", "0", "1.5", "k"])
def test_a_bad_env_step_budget_is_named_in_the_error(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a positive number of env steps"):
        plot.parse_env_steps(text)


def test_plot_command_writes_png_markdown_and_json(tmp_path):
    for seed, final in enumerate(FINALS[:3]):
        run_dir = tmp_path / "sweep/fetch_push_td3" / f"seed{seed}"
        fake_run(run_dir, seed, [0.0, final])
        (run_dir / "sweep.json").write_text(json.dumps(  # as the sweep writes it
            {"recipe": "fetch_push_td3", "name": "fetch_push_td3", "seed": seed,
             "overrides": ["algo.n_step=3", "log.tensorboard=false"]}))
    result = subprocess.run([sys.executable, "-m", "her_mpi.plot", str(tmp_path / "sweep"), "-o",
                             str(tmp_path / "curve.png"), "--table", str(tmp_path / "table")],
                            capture_output=True, text=True, env=mpi_env(), cwd=ROOT, timeout=300)
    assert result.returncode == 0, describe(result)
    assert (tmp_path / "curve.png").stat().st_size > 1000
    data = json.loads((tmp_path / "table.json").read_text())
    # labelled by the sweep's recipe and the overrides that change learning
    assert data["recipes"][0]["recipe"].startswith("fetch_push_td3 algo.n_step=3 (np=2")
    # the runs relative to the table, so the JSON still finds them in a checkout elsewhere
    assert data["recipes"][0]["runs"] == [f"sweep/fetch_push_td3/seed{seed}" for seed in range(3)]
    markdown = (tmp_path / "table.md").read_text()
    assert "fetch_push_td3" in markdown and "not reached" in markdown and "| 3 (0, 1, 2) |" in markdown


def test_a_long_recipe_label_leaves_the_curve_most_of_the_figure(tmp_path, monkeypatch):
    """A label of many overrides once made tight_layout squeeze the axes into a sliver of the PNG."""
    import matplotlib.pyplot as plt

    fake_run(tmp_path / "seed0", 0, [0.2, 0.4])
    (recipe,) = plot.group(plot.find_runs([tmp_path]))
    recipe.label = ("ms_pacman_goal_htrpo normalizer.enabled=false algo.activation=tanh algo.is_normaliser=running "
                    "algo.critic=false algo.original_goals=false algo.entropy_coef=0.03 train.max_env_steps=2000000 "
                    "(np=2, 3 seeds)")  # a real one: unwrapped, the axes kept 0.27 of the width
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to measure it
    plot.plot([recipe], [plot.summarise(recipe, reps=50)], tmp_path / "c.png", "title")
    (axes,) = figures[0].axes
    assert axes.get_position().width > 0.7


def test_plot_names_a_directory_without_runs(tmp_path):
    result = subprocess.run([sys.executable, "-m", "her_mpi.plot", str(tmp_path)], capture_output=True,
                            text=True, env=mpi_env(), cwd=ROOT, timeout=120)
    assert result.returncode != 0 and "no runs under" in result.stderr
