"""Early signals of hindsight on-policy runs side by side: what moves long before test success does.

    python experiments/early_signals.py experiments/results/runs/htrpo_push/*/seed0 \
        runs/sweeps/htrpo_push_levers/*/fetch_push_htrpo/seed0 --spans 80k,176k --name htrpo_push_levers_early

For each run (progress.csv; labelled by its recipe and overrides, budget keys left out): train
success averaged over env-step spans (on continuous FetchPush the untrained policy's is ~0.06 and a
policy that only learns to disturb the object falls below it), test success over the same spans,
and at the span edges the last logged entropy, hindsight copies reaching their goal per iteration
(copies_reached) and the importance weights' effective sample size (ess), each an epoch's mean
over its iterations. Writes experiments/results/<name>.{md,json,png}.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

from common import progress

from her_mpi.plot import parse_span_edges

BUDGET_KEYS = ("train.n_epochs", "train.max_env_steps", "train.seed")
SIGNALS = ("entropy", "copies_reached", "ess")


def label(run: Path) -> str:
    """The run's recipe and its overrides, without the budget's."""
    sweep = run / "sweep.json"
    if not sweep.exists():
        return run.name
    info = json.loads(sweep.read_text())
    overrides = [o for o in info.get("overrides", []) if not o.startswith(BUDGET_KEYS)]
    return " ".join([info.get("recipe", run.name), *overrides])


def span_mean(rows: list[dict], key: str, low: int, high: int) -> float | None:
    values = [r[key] for r in rows if low < r["env_steps"] <= high and r.get(key) is not None]
    return round(sum(values) / len(values), 4) if values else None


def last_before(rows: list[dict], key: str, edge: int) -> float | None:
    values = [r[key] for r in rows if r["env_steps"] <= edge and r.get(key) is not None]
    return round(values[-1], 4) if values else None


def summarise(run: Path, edges: list[int]) -> dict:
    rows = progress(run)
    if not rows:
        raise SystemExit(f"early_signals: {run}/progress.csv has no rows yet")
    reached = max(int(r["env_steps"]) for r in rows)
    bounds = list(zip([0, *edges], edges))
    summary = {"run": str(run), "label": label(run), "env_steps": reached, "spans": []}
    for low, high in bounds:
        covered = reached >= high
        summary["spans"].append({
            "span": [low, high], "complete": covered,
            "train_success": span_mean(rows, "train_success_rate", low, high),
            "test_success": span_mean(rows, "test_success_rate", low, high),
            **{f"{k}_at_end": last_before(rows, k, high) for k in SIGNALS},
        })
    summary["curve"] = {k: [math.nan if r.get(k) is None else r[k] for r in rows] for k in
                        ("env_steps", "train_success_rate", "test_success_rate", *SIGNALS)}
    return summary


def fmt(value, digits=2) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.{digits}f}"


def markdown(summaries: list[dict], edges: list[int]) -> str:
    spans = [f"{low // 1000}k–{high // 1000}k" for low, high in zip([0, *edges], edges)]
    head = ["run", "env steps"] + [f"{what} {s}" for s in spans for what in ("train", "test")] + \
        [f"{what} at {spans[-1].split('–')[1]}" for what in ("entropy", "copies reached", "ess")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        cells = [s["label"], f"{s['env_steps'] // 1000}k"]
        for span in s["spans"]:
            mark = "" if span["complete"] else "*"
            cells += [fmt(span["train_success"]) + mark, fmt(span["test_success"]) + mark]
        last = s["spans"][-1]
        cells += [fmt(last["entropy_at_end"]), fmt(last["copies_reached_at_end"]), fmt(last["ess_at_end"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n* the run has not reached the span's end: the mean is over what it has.\n"


def plot(summaries: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("train_success_rate", "copies_reached", "ess", "entropy")
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6))
    for s in summaries:
        steps = [x / 1000 for x in s["curve"]["env_steps"]]
        for ax, key in zip(axes, keys):
            ax.plot(steps, s["curve"][key], label=s["label"], linewidth=1.2)
    for ax, key in zip(axes, keys):
        ax.set_title(key.replace("_", " "))
        ax.set_xlabel("env steps (k)")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with a progress.csv)")
    parser.add_argument("--spans", type=parse_span_edges, default=(80_000, 176_000),
                        help="span edges in env steps (default 80k,176k)")
    parser.add_argument("--name", required=True, help="experiments/results/<name>.{md,json,png}")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    edges = list(args.spans)
    for run in args.runs:
        if not (run / "progress.csv").exists():
            parser.error(f"{run}: no progress.csv there; expected a run directory")
    summaries = [summarise(run, edges) for run in args.runs]
    labels = [s["label"] for s in summaries]
    names = [f"{label} ({run.name})" for label, run in zip(labels, args.runs)]
    for run, s, name in zip(args.runs, summaries, names):
        if labels.count(s["label"]) > 1:  # seeds of one recipe (or one seed in two sweeps): tell them apart
            s["label"] = name if names.count(name) == 1 else f"{s['label']} ({run})"
    args.out.mkdir(parents=True, exist_ok=True)
    table = markdown(summaries, edges) + f"\nMade by `python experiments/early_signals.py {shlex.join(sys.argv[1:])}`\n"
    (args.out / f"{args.name}.md").write_text(table)
    (args.out / f"{args.name}.json").write_text(json.dumps({"spans": edges, "runs": summaries}, indent=1))
    plot(summaries, args.out / f"{args.name}.png")
    print(table)


if __name__ == "__main__":
    main()
