"""Policies controlling their simulated robot through ROS 2: where added latency and message loss break them.

    python bench/ros_closed_loop.py [--policies zoo:fetch_reach zoo:fetch_push] [--episodes 30]

For each policy: its success in direct evaluation (``her_mpi.evaluate``, the same episodes), then
through ROS (``her_mpi.ros_sim``: the controller in its own process, real topics) at every added
latency (each way, no loss) and every loss rate (no added latency), and once with its inputs
stopped mid-episode. Writes ``bench/results/ros_closed_loop.json`` and ``.png``: success against
latency and against loss, with the controller's achieved rate, its stale-input safe actions and
the end-to-end latency (observation published to its action received, p50/p99) of every run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from common import RESULTS, ROOT, save  # noqa: E402


def run(module: str, *args) -> dict:
    cmd = [sys.executable, "-m", module, *map(str, args)]
    print("$", " ".join(cmd), flush=True)
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"{module} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def plot(results: dict, episodes: int) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for policy, r in results.items():
        latencies = [float(ms) for ms in r["by_latency_ms"]]
        line, = left.plot(latencies, [x["success_rate"] for x in r["by_latency_ms"].values()], "o-",
                          label=f"{policy} through ROS")
        left.axhline(r["direct_success_rate"], color=line.get_color(), ls="--", lw=0.8)
        right.plot([100 * float(p) for p in r["by_drop"]], [x["success_rate"] for x in r["by_drop"].values()], "o-",
                   color=line.get_color(), label=f"{policy} through ROS")
        right.axhline(r["direct_success_rate"], color=line.get_color(), ls="--", lw=0.8, label=f"{policy} direct")
    left.set_xscale("symlog", linthresh=10)
    left.set_xticks(latencies, [f"{ms:g}" for ms in latencies])
    left.set(xlim=(0, max(latencies) * 1.15), xlabel="added latency each way (ms)",
             ylabel=f"success ({episodes} episodes)", ylim=(-0.05, 1.05), title="success vs latency")
    right.set(xlabel="messages lost, each way (%)", ylim=(-0.05, 1.05), title="success vs message loss")
    right.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(RESULTS / "ros_closed_loop.png", dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", nargs="+", default=["zoo:fetch_reach", "zoo:fetch_push"])
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latencies-ms", type=float, nargs="+", default=[0, 10, 20, 40, 80, 160])
    parser.add_argument("--drops", type=float, nargs="+", default=[0.0, 0.1, 0.3, 0.5])
    parser.add_argument("--replot", action="store_true", help="redraw the PNG from the saved JSON, run nothing")
    args = parser.parse_args()
    if args.replot:
        saved = json.loads((RESULTS / "ros_closed_loop.json").read_text())
        plot(saved["results"], saved["episodes"])
        return
    common = ["--episodes", args.episodes, "--seed", args.seed]
    results = {}
    for policy in args.policies:
        direct = run("her_mpi.evaluate", "--policy", policy, *common, "--parallel-envs", 1)
        latency = {ms: run("her_mpi.ros_sim", "--policy", policy, *common, "--latency-ms", ms)
                   for ms in args.latencies_ms}
        loss = {p: latency[0.0] if p == 0 and 0.0 in latency else
                run("her_mpi.ros_sim", "--policy", policy, *common, "--drop", p) for p in args.drops}
        stopped = run("her_mpi.ros_sim", "--policy", policy, "--episodes", 1, "--seed", args.seed,
                      "--stop-inputs-s", 2, "--trigger", "timer")
        results[policy] = {"direct_success_rate": direct["success_rate"], "by_latency_ms": latency,
                           "by_drop": loss, "inputs_stopped": stopped["inputs_stopped"]}
    plot(results, args.episodes)
    save("ros_closed_loop", {"episodes": args.episodes, "seed": args.seed, "results": results})


if __name__ == "__main__":
    main()
