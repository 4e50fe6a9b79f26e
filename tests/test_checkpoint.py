"""Checkpoint and replay files without MPI: safe loading, format versions, failed writes, the
incremental replay store (exact round trip, only new episodes written, old files removed) and
progress.csv across resumes."""

import csv
import errno
import json
import os

import numpy as np
import pytest
import torch

from her_mpi.checkpoint import (FORMAT_VERSION, CheckpointWriteError, ReplayFileError, ReplayStore, atomic_write,
                                load_checkpoint, save_checkpoint, to_safe)
from her_mpi.config import ConfigError
from her_mpi.logger import RunLogger
from her_mpi.replay.buffer import ReplayBuffer
from her_mpi.rollout import Episodes


class RunsCode:
    """Unpickling this calls os.system: what a malicious or careless checkpoint could do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# -- safe checkpoints ------------------------------------------------------------------------------

def test_a_checkpoint_whose_unpickling_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "code_ran"
    path = tmp_path / "latest.pt"
    torch.save({"format": FORMAT_VERSION, "agent": {"x": RunsCode(marker)}}, path)
    with pytest.raises(ConfigError, match="refusing to load") as error:
        load_checkpoint(path)
    assert "could run code" in str(error.value) and str(path) in str(error.value)
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the file really does run code when loaded unsafely
    assert marker.exists()


def test_checkpoints_of_another_format_are_a_clear_error(tmp_path):
    older, newer = tmp_path / "older.pt", tmp_path / "newer.pt"
    # format 1 was a plain pickle with numpy arrays inside: refused by the safe loader, still named
    torch.save({"format": 1, "agent": {"total": np.zeros(3)}}, older)
    torch.save({"format": FORMAT_VERSION + 1, "agent": {}}, newer)
    with pytest.raises(ConfigError, match=r"format 1, written by an older her_mpi"):
        load_checkpoint(older)
    with pytest.raises(ConfigError, match=rf"format {FORMAT_VERSION + 1}, written by a newer her_mpi.*Upgrade"):
        load_checkpoint(newer)
    not_ours = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, not_ours)
    with pytest.raises(ConfigError, match="no format version"):
        load_checkpoint(not_ours)


def test_files_that_are_no_checkpoint_say_what_they_are(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "notes.pt").write_text("hello")
    (tmp_path / "policy.onnx").write_bytes(b"\x08\x09\x12\x07pytorch")  # an ONNX protobuf's first bytes
    for name, message in [("empty.pt", "the file is empty"), ("notes.pt", "it is not a file torch.save wrote"),
                          ("policy.onnx", "it is an exported ONNX policy, not a training checkpoint .* --policy")]:
        with pytest.raises(ConfigError, match=f"'{tmp_path / name}' is not a her_mpi checkpoint: {message}"):
            load_checkpoint(tmp_path / name)


def test_saved_state_round_trips_through_the_safe_loader(tmp_path):
    rng = np.random.default_rng(3)
    state = {"rng": rng.bit_generator.state, "torch": torch.Generator().get_state(), "total": np.arange(4.0),
             "scalar": np.float64(0.5), "pair": (1, "a"), "nested": [{"n": np.int64(7)}]}
    save_checkpoint(tmp_path / "c.pt", state)
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert loaded["format"] == FORMAT_VERSION and loaded["rng"] == rng.bit_generator.state
    assert torch.equal(loaded["total"], torch.arange(4.0, dtype=torch.float64))
    assert loaded["scalar"] == 0.5 and type(loaded["scalar"]) is float
    assert loaded["pair"] == (1, "a") and loaded["nested"] == [{"n": 7}]


def test_state_that_is_not_plain_data_is_refused_when_saving():
    with pytest.raises(TypeError, match=r"checkpoint\['agent'\]\['thing'\] is a RunsCode"):
        to_safe({"agent": {"thing": RunsCode("x")}})


# -- failed writes ---------------------------------------------------------------------------------

def test_a_failing_write_names_the_path_and_keeps_the_previous_file(tmp_path):
    path = tmp_path / "latest.pt"
    path.write_bytes(b"previous")

    def disk_full(f):
        f.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(CheckpointWriteError, match="No space left on device") as error:
        atomic_write(path, disk_full)
    assert str(path) in str(error.value) and "nothing there was replaced" in str(error.value)
    assert path.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["latest.pt"]  # no temporary debris


def test_an_unwritable_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "checkpoints"
    blocker.write_text("a file where the directory should be")  # fails even for root
    with pytest.raises(CheckpointWriteError, match="could not write") as error:
        save_checkpoint(blocker / "latest.pt", {"epoch": 0})
    assert str(blocker / "latest.pt") in str(error.value)


# -- the incremental replay store --------------------------------------------------------------------

T, OBS, GOAL, ACT = 5, 3, 2, 2


def reward(ag, g):
    return -(np.abs(ag - g).sum(-1) > 0.5).astype(np.float32)


def make_buffer(prioritized=True, episodes=10):
    return ReplayBuffer(episodes * T, T, OBS, GOAL, ACT, False, reward, prioritized=prioritized)


def episodes(n, rng):
    return Episodes(obs=rng.standard_normal((n, T + 1, OBS), np.float32),
                    ag=rng.standard_normal((n, T + 1, GOAL), np.float32),
                    g=rng.standard_normal((n, T + 1, GOAL), np.float32),
                    actions=rng.uniform(-1, 1, (n, T, ACT)).astype(np.float32),
                    rewards=np.zeros((n, T), np.float32), lengths=rng.integers(1, T + 1, n),
                    success=np.zeros(n, np.float32))


def assert_same_buffer(a, b):
    for name, array in a.episode_fields().items():
        assert np.array_equal(array, b.episode_fields()[name]), name
    assert a.ring_state() == b.ring_state()
    assert np.array_equal(a.priorities.tree.sums, b.priorities.tree.sums)
    assert np.array_equal(a.priorities.tree.mins, b.priorities.tree.mins)
    # the same draws from both: identical batches (sum tree, cumulative lengths, relabelling)
    batch_a = a.sample(16, "future", 4, np.random.default_rng(1), beta=0.5)
    batch_b = b.sample(16, "future", 4, np.random.default_rng(1), beta=0.5)
    for key in batch_a:
        assert np.array_equal(batch_a[key], batch_b[key]), key


def test_replay_store_restores_the_buffer_exactly_after_the_ring_wraps(tmp_path):
    rng = np.random.default_rng(0)
    buffer, store = make_buffer(), ReplayStore(tmp_path / "replay_rank0")
    for generation, n in enumerate([3, 4, 6, 2, 9], start=1):  # wraps the 10-episode ring twice
        buffer.store(episodes(n, rng))
        flat = rng.integers(0, buffer.n_episodes * T, 20)
        buffer.update_priorities(flat, rng.random(20))
        store.save(buffer, generation)
        store.commit(generation)
        restored = make_buffer()
        ReplayStore(tmp_path / "replay_rank0").load(restored, generation)
        assert_same_buffer(buffer, restored)
    # a restored store continues incrementally from where it was
    store = ReplayStore(tmp_path / "replay_rank0")
    continued = make_buffer()
    store.load(continued, 5)
    batch = episodes(2, rng)
    for b in (buffer, continued):
        b.store(batch)
    assert store.save(continued, 6)["episodes"] == 2
    final = make_buffer()
    ReplayStore(tmp_path / "replay_rank0").load(final, 6)
    assert np.array_equal(final.obs, buffer.obs) and final.ring_state()["n_stored"] == buffer.n_stored


def test_each_save_writes_only_the_episodes_stored_since_the_last_one(tmp_path):
    rng = np.random.default_rng(0)
    buffer, store = make_buffer(prioritized=False, episodes=100), ReplayStore(tmp_path)
    buffer.store(episodes(40, rng))
    first = store.save(buffer, 1)
    buffer.store(episodes(5, rng))
    second = store.save(buffer, 2)
    assert (first["episodes"], second["episodes"]) == (40, 5)
    size = {p.name: p.stat().st_size for p in tmp_path.glob("segment-*.npz")}
    assert size["segment-g00000002-0000.npz"] < size["segment-g00000001-0000.npz"] / 4
    assert store.save(buffer, 3)["episodes"] == 0
    buffer.store(episodes(100, rng))
    buffer.store(episodes(50, rng))  # more than the ring holds since the last save: all of it
    assert store.save(buffer, 4)["episodes"] == 100


def test_files_only_older_generations_used_are_removed_once_committed(tmp_path):
    rng = np.random.default_rng(0)
    buffer, store = make_buffer(prioritized=True, episodes=10), ReplayStore(tmp_path)
    buffer.store(episodes(6, rng))
    store.save(buffer, 1)
    store.commit(1)
    buffer.store(episodes(6, rng))  # overwrites 2 of the first segment's 6 slots
    store.save(buffer, 2)
    # not committed yet (latest.pt may still name generation 1): both stay loadable
    for generation in (1, 2):
        ReplayStore(tmp_path).load(make_buffer(), generation)
    store.commit(2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["manifest-g00000002.json", "priorities-g00000002.npy",
                     "segment-g00000001-0000.npz", "segment-g00000002-0000.npz"]
    buffer.store(episodes(10, rng))  # the whole ring: earlier segments hold nothing live
    store.save(buffer, 3)
    store.commit(3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest-g00000003.json", "priorities-g00000003.npy", "segment-g00000003-0000.npz"]
    assert not store.has(2) and store.has(3)


def test_a_large_save_is_split_so_overwritten_parts_can_be_freed(tmp_path):
    rng = np.random.default_rng(0)
    buffer, store = make_buffer(prioritized=False, episodes=50), ReplayStore(tmp_path)
    store.SEGMENT_EPISODES = 20
    buffer.store(episodes(50, rng))
    store.save(buffer, 1)
    assert len(list(tmp_path.glob("segment-*.npz"))) == 3  # 20 + 20 + 10
    buffer.store(episodes(25, rng))
    store.save(buffer, 2)
    store.commit(2)
    assert not (tmp_path / "segment-g00000001-0000.npz").exists()  # its 20 slots all overwritten
    assert (tmp_path / "segment-g00000001-0001.npz").exists()


def test_replay_files_that_do_not_fit_or_hold_pickles_are_refused(tmp_path):
    rng = np.random.default_rng(0)
    buffer, store = make_buffer(prioritized=False), ReplayStore(tmp_path)
    buffer.store(episodes(4, rng))
    store.save(buffer, 1)
    with pytest.raises(ValueError, match="does not fit this buffer"):
        store.load(make_buffer(prioritized=False, episodes=20), 1)
    # a segment replaced by one holding a pickled object that would run code when loaded
    marker = tmp_path / "code_ran"
    segment = next(tmp_path.glob("segment-*.npz"))
    evil = np.empty(1, dtype=object)
    evil[0] = RunsCode(marker)
    with open(segment, "wb") as f:
        np.savez(f, slots=np.arange(4), obs=evil)
    with pytest.raises(ReplayFileError, match="refusing to load .* could run code"):
        ReplayStore(tmp_path).load(make_buffer(prioritized=False), 1)
    assert not marker.exists()
    manifest = tmp_path / "manifest-g00000001.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": 99}))
    with pytest.raises(ReplayFileError, match="format 99"):
        ReplayStore(tmp_path).load(make_buffer(prioritized=False), 1)


# -- progress.csv across resumes ---------------------------------------------------------------------

def rows_of(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_progress_keeps_one_header_across_resumes(tmp_path):
    base = {"env_steps": 100, "env_steps_per_rank": 50, "n_ranks": 2, "test_success_rate": 0.5,
            "train_success_rate": 0.25, "time_s": 1.0, "critic_loss": 0.1}
    logger = RunLogger(tmp_path, tensorboard=False)
    for epoch in range(3):
        logger.log({**base, "epoch": epoch})
    logger.close()
    # a resume from epoch 1's checkpoint: epoch 2's row (trained again) goes, a new column comes
    logger = RunLogger(tmp_path, tensorboard=False, after_epoch=1)
    logger.log({**base, "epoch": 2, "test_return": -3.0})
    logger.log({**base, "epoch": 3, "test_return": -2.0})
    logger.close()
    header, rows = rows_of(tmp_path / "progress.csv")
    assert [r["epoch"] for r in rows] == ["0", "1", "2", "3"]
    assert header[:7] == ["epoch", "env_steps", "env_steps_per_rank", "n_ranks", "test_success_rate",
                          "train_success_rate", "time_s"]
    assert header[-1] == "test_return" and header.count("test_return") == 1
    assert [r["test_return"] for r in rows] == ["", "", "-3", "-2"]
    assert all(r["critic_loss"] == "0.1" for r in rows)
    # a resume from before the first epoch keeps the header and drops every row
    RunLogger(tmp_path, tensorboard=False, after_epoch=-1).close()
    header_after, rows = rows_of(tmp_path / "progress.csv")
    assert header_after == header and rows == []
