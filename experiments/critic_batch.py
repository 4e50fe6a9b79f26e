"""What a minibatch value fit (algo.critic_batch_size) costs HTRPO's critic, measured on trained checkpoints.

    python experiments/critic_batch.py RUN_DIR [RUN_DIR ...] [--episodes 16 --sizes 0 32768 8192 --name NAME]

HTRPO refits its value network V(s, g) once per iteration: algo.critic_iters Adam steps on that
iteration's TD targets, over every row (hundreds of thousands of hindsight rows on Fetch) unless
algo.critic_batch_size draws fewer per step. This script collects two batches of exploration
episodes with each run's checkpoints/latest.pt (one process, ``--episodes`` per batch: up to a
rank's share of an iteration) and builds them as training does. From the checkpoint's critic and
optimizer it then fits batch A's targets with each ``--sizes`` value (0: the full batch) and
reports the fit's seconds, its loss on A, its loss on batch B (rows it never saw: what the next
iteration's advantages lean on), and how far its values on B are from the full-batch fit's (RMS,
in units of B's target spread; on the "before" row, how far the full fit itself moves them).
Batch B's targets are the checkpoint critic's TD targets, so the "before" row's held-out loss is
that critic's own TD error: compare the fits with each other, not with it. One fit from one
checkpoint, not a training run: it says whether a minibatch fits as well, not how learning goes.
Seconds are this machine's, side by side in one process. Results: experiments/results/<name>.json and .md.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS  # noqa: E402
from htrpo_batches import htrpo_from_checkpoint  # noqa: E402
from unseen_eval import run_dirs  # noqa: E402  (also puts this checkout's her_mpi first)

from her_mpi.process_tuning import reuse_large_allocations  # noqa: E402


@torch.no_grad()
def mse(agent, x: torch.Tensor, targets: torch.Tensor) -> float:
    return float((agent.value_net(x).squeeze(-1) - targets).pow(2).mean())


def measure(run: Path, n_episodes: int, sizes: list[int]) -> dict:
    rows: list[dict] = []
    with htrpo_from_checkpoint(run, n_episodes, "critic_batch.py") as (state, config, agent, learn):
        if not config.algo.critic:
            raise SystemExit(f"critic_batch.py: {run} has algo.critic false, expected an htrpo run with a critic")
        torch.set_num_threads(config.train.torch_threads)  # the process settings a training rank runs with
        torch.set_flush_denormal(True)
        reuse_large_allocations()
        agent.policy_step = lambda batch: {}  # the batch and its targets are built as training does; no step
        held_out: list[tuple[torch.Tensor, torch.Tensor]] = []

        def capture(x, targets, iterations, batch_size):
            held_out.append((x, targets))
            return 0.0

        def compare(x, targets, iterations, batch_size):  # runs where training would fit, in training's state
            x_b, t_b = held_out[0]
            start = copy.deepcopy((agent.value_net.state_dict(), agent.value_optimizer.state_dict()))

            def restore():
                agent.value_net.load_state_dict(start[0])
                agent.value_optimizer.load_state_dict(copy.deepcopy(start[1]))

            def fit_row(size, seconds):
                with torch.no_grad():
                    values = agent.value_net(x_b).squeeze(-1)
                return values, {"critic_batch_size": size, "rows": len(x), "iterations": iterations,
                                "fit_s": seconds, "loss_fit_batch": mse(agent, x, targets),
                                "loss_held_out": mse(agent, x_b, t_b)}

            fitted = [fit_row(None, 0.0)]  # the checkpoint's critic, before this batch's fit
            for size in sizes:
                restore()
                began = time.perf_counter()
                type(agent).fit_value(agent, x, targets, iterations, size)
                fitted.append(fit_row(size, time.perf_counter() - began))
            full_values = fitted[1][0]
            for values, row in fitted:  # before the fit: how far the full fit moves the values
                row["rms_from_full_fit"] = float((values - full_values).pow(2).mean().sqrt() / t_b.std())
                rows.append(row)
            restore()
            return 0.0

        for fit in (capture, compare):  # batch B first (held out), then batch A (fitted)
            agent.fit_value = fit
            learn()
    return {"run": str(run), "env_steps": int(state.get("env_steps", 0) or 0), "episodes": n_episodes,
            "held_out_rows": len(held_out[0][0]), "held_out_target_std": float(held_out[0][1].std()), "fits": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run or sweep directories with checkpoints/latest.pt")
    parser.add_argument("--episodes", type=int, default=16,
                        help="episodes per batch (a rank's share of an iteration: 16 in fetch_push_discrete_htrpo, "
                             "32 in fetch_push_htrpo)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 32768, 8192],
                        help="algo.critic_batch_size values to fit with (0: the full batch; put it first)")
    parser.add_argument("--name", default="critic_batch", help="results file stem in experiments/results/")
    args = parser.parse_args()
    if args.episodes < 1 or any(size < 0 for size in args.sizes) or args.sizes[0] != 0:
        parser.error(f"--episodes {args.episodes}, --sizes {args.sizes}: expected episodes >= 1 and sizes >= 0 "
                     "starting with 0 (the full-batch fit the others are compared with)")
    results = []
    for run in run_dirs(args.runs):
        result = measure(run, args.episodes, args.sizes)
        for fit in result["fits"]:
            print(f"{run} size {fit['critic_batch_size']}: {fit['fit_s']:.1f} s, loss {fit['loss_fit_batch']:.4g} "
                  f"(held out {fit['loss_held_out']:.4g}), rms from full {fit['rms_from_full_fit']:.3f}", flush=True)
        results.append(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = ["| run | env steps | rows fitted | critic_batch_size | fit s | loss, fitted batch | loss, held-out batch |"
             " values vs full fit (RMS / target std) |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for f in r["fits"]:
            size = "before the fit" if f["critic_batch_size"] is None else (f["critic_batch_size"] or "full")
            rms = f"{f['rms_from_full_fit']:.3f}"
            lines.append(f"| {r['run']} | {r['env_steps']:,} | {f['rows']:,} | {size} | {f['fit_s']:.1f} | "
                         f"{f['loss_fit_batch']:.4g} | {f['loss_held_out']:.4g} | {rms} |")
    (RESULTS / f"{args.name}.md").write_text(
        f"`python experiments/critic_batch.py {' '.join(sys.argv[1:])}`\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {RESULTS / args.name}.json and .md")


if __name__ == "__main__":
    main()
