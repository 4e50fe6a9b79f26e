"""Cost of keeping a rank's replay buffer with the checkpoints: incremental saves vs. a full rewrite.

    python bench/replay_save.py [--epochs 20] [--size 1000000] [--env FetchPush-v4] [--prioritized]

A full FetchPush buffer (1M transitions = 20,000 episodes of 50 steps, the baselines size) takes
the baselines schedule's 100 new episodes per rank per epoch (50 cycles x 2 rollouts); after each
epoch the rank saves what checkpoints save (``ReplayStore.save`` + ``commit``). Reported: ms per
epoch and MB written per epoch, MB on disk, the first (full) save and a resume's load, next to the
old way (``np.savez`` of the whole buffer every epoch). Prints and writes JSON to bench/results/.
Episode contents are random numbers (uncompressed files: the cost does not depend on them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from her_mpi.checkpoint import ReplayStore, atomic_write
from her_mpi.config import EnvConfig
from her_mpi.envs import env_spec, make_env
from her_mpi.replay.buffer import ReplayBuffer
from her_mpi.rollout import Episodes

RESULTS = Path(__file__).resolve().parent / "results"


def random_episodes(n: int, spec, rng: np.random.Generator) -> Episodes:
    T = spec.horizon
    return Episodes(obs=rng.standard_normal((n, T + 1, spec.obs_dim), np.float32),
                    ag=rng.standard_normal((n, T + 1, spec.goal_dim), np.float32),
                    g=rng.standard_normal((n, T + 1, spec.goal_dim), np.float32),
                    actions=rng.uniform(-1, 1, (n, T, spec.action_dim)).astype(np.float32),
                    rewards=np.zeros((n, T), np.float32), lengths=np.full(n, T, np.int64),
                    success=np.zeros(n, np.float32))


def directory_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.iterdir()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="FetchPush-v4")
    parser.add_argument("--size", type=int, default=1_000_000, help="replay.size (transitions)")
    parser.add_argument("--episodes-per-epoch", type=int, default=100, help="n_cycles x rollouts_per_rank")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--prioritized", action="store_true")
    parser.add_argument("--dir", help="where to write (default: a temporary directory, removed after)")
    args = parser.parse_args()

    env = make_env(EnvConfig(id=args.env), 0)
    spec = env_spec(env, args.env)
    rng = np.random.default_rng(0)
    buffer = ReplayBuffer(args.size, spec.horizon, spec.obs_dim, spec.goal_dim, spec.action_dim, spec.discrete,
                          None, None, prioritized=args.prioritized)
    for start in range(0, buffer.capacity, 1000):  # fill the ring: the steady state of a long run
        buffer.store(random_episodes(min(1000, buffer.capacity - start), spec, rng))
    if args.prioritized:
        buffer.update_priorities(rng.integers(0, buffer.capacity * spec.horizon, 100_000), rng.random(100_000))
    buffer_mb = sum(a.nbytes for a in buffer.episode_fields().values()) / 2**20

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="replay_save_"))
    try:
        store = ReplayStore(root / "replay_rank0")
        tick = time.perf_counter()
        first = store.save(buffer, 1)
        store.commit(1)
        first_save_s = time.perf_counter() - tick

        epoch_ms, epoch_mb = [], []
        new = random_episodes(args.episodes_per_epoch, spec, rng)
        for epoch in range(args.epochs):
            buffer.store(new)
            tick = time.perf_counter()
            stats = store.save(buffer, epoch + 2)
            store.commit(epoch + 2)
            epoch_ms.append(1000 * (time.perf_counter() - tick))
            epoch_mb.append(stats["bytes"] / 2**20)
        disk_mb = directory_mb(store.directory)
        n_files = len(list(store.directory.iterdir()))

        loaded = ReplayBuffer(args.size, spec.horizon, spec.obs_dim, spec.goal_dim, spec.action_dim, spec.discrete,
                              None, None, prioritized=args.prioritized)
        tick = time.perf_counter()
        ReplayStore(store.directory).load(loaded, args.epochs + 1)
        load_s = time.perf_counter() - tick
        assert all(np.array_equal(a, b) for a, b in zip(buffer.episode_fields().values(),
                                                         loaded.episode_fields().values()))

        full_ms = []  # the old way: the whole buffer, every epoch
        for _ in range(3):
            state = buffer.state_dict()
            tick = time.perf_counter()
            size = atomic_write(root / "replay_full.npz",
                                lambda f: np.savez(f, **{k: np.asarray(v) for k, v in state.items()}))
            full_ms.append(1000 * (time.perf_counter() - tick))
        full_mb = size / 2**20
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)

    result = {
        "env": args.env, "replay_size": args.size, "episodes": buffer.capacity, "horizon": spec.horizon,
        "obs_dim": spec.obs_dim, "goal_dim": spec.goal_dim, "action_dim": spec.action_dim,
        "prioritized": args.prioritized, "episodes_per_epoch": args.episodes_per_epoch, "epochs": args.epochs,
        "buffer_mb_in_memory": round(buffer_mb, 1),
        "incremental": {
            "ms_per_epoch_median": round(statistics.median(epoch_ms), 1),
            "ms_per_epoch_max": round(max(epoch_ms), 1),
            "mb_written_per_epoch": round(statistics.median(epoch_mb), 2),
            "mb_on_disk": round(disk_mb, 1), "files_on_disk": n_files,
            "first_save_s": round(first_save_s, 2), "first_save_mb": round(first["bytes"] / 2**20, 1),
            "resume_load_s": round(load_s, 2),
        },
        "full_rewrite": {"ms_per_epoch_median": round(statistics.median(full_ms), 1),
                         "mb_written_per_epoch": round(full_mb, 1)},
        "note": "2-core machine shared with a background training sweep: timings are contended",
    }
    print(json.dumps(result, indent=1))
    RESULTS.mkdir(exist_ok=True)
    name = "replay_save" + ("_prioritized" if args.prioritized else "") + ".json"
    (RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULTS / name}")


if __name__ == "__main__":
    main()
