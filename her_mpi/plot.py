"""Learning curves and results tables, aggregated over seeds.

    python -m her_mpi.plot RUN_OR_SWEEP_DIR [...] [-o success.png] [--table results/push] [--at 300k]
        [--spans 250k,500k,1M]

Every directory given is searched for runs (directories with a ``progress.csv``). Runs whose
``config.yaml`` is the same apart from the seed (and logging/checkpoint settings) at the same
number of ranks are one recipe: its curve is the interquartile mean (IQM) of test success over
the seeds against total env steps, with a 95% stratified-bootstrap confidence band (``rliable``).
Seeds with equal epoch counts are compared epoch by epoch; seeds that ran different numbers of epochs
(an env-step budget with episodes that end early) at equal env steps, each read at its last evaluation
at or before the step. A recipe with one run is drawn as that run's curve.

``--table PREFIX`` also writes PREFIX.md and PREFIX.json: per recipe, the IQM at the budget (the
curve's last point: the last epoch every seed reached, at the seeds' mean env steps, or the last env
step every seed reached) with its interval, env steps until the IQM curve first reaches
0.5 / 0.8 / 0.9, seeds, ranks, test episodes per evaluation and wall-clock seconds per 100k env
steps (median over seeds). ``--at 300k`` (repeatable) adds the IQM and its interval at an earlier
budget: the last evaluation at or before 300k env steps, so one long sweep answers both a table's
budget and "where does it stand at 300k". ``--spans 250k,500k,1M`` adds, per seed, test (and train)
success averaged over the evaluations in each span of env steps (<250k, 250k-500k, 500k-1M, >=1M): a
long run's single evaluations move by +-0.1, so its level over a stretch of training is read from these.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from her_mpi.logger import read_progress

THRESHOLDS = (0.5, 0.8, 0.9)
# Sections that change how a run is recorded, not what it learns; the budgets (epochs, env steps)
# only say where its curve stops (the table reports the budget every seed reached).
NOT_RECIPE = {("train", "seed"), ("checkpoint",), ("log",), ("train", "n_epochs"), ("train", "max_env_steps")}


@dataclass
class Run:
    path: Path
    rows: list[dict]
    config: dict
    name: str | None  # the sweep's recipe name (finished.json / sweep), if known

    @property
    def n_ranks(self) -> int:
        return int(float(self.rows[-1]["n_ranks"]))

    @property
    def seed(self) -> int | None:
        return self.config.get("train", {}).get("seed")

    def column(self, key: str) -> np.ndarray:
        return np.array([float(r[key]) if r.get(key) not in (None, "") else np.nan for r in self.rows])


@dataclass
class Recipe:
    label: str
    runs: list[Run] = field(default_factory=list)

    @property
    def n_epochs(self) -> int:
        """Epochs every seed has reached."""
        return min(len(r.rows) for r in self.runs)

    def aligned(self) -> tuple[np.ndarray, np.ndarray]:
        """The env steps the aggregate is read at and test success there [seeds, 1 task, points].

        Seeds with equal epoch counts (an epoch budget) are compared epoch by epoch, at the mean of their env
        steps: the same thing as equal env steps when episodes have one length. Seeds that ran different
        numbers of epochs (an env-step budget with episodes that end early, ``train.stop_success``, or runs
        still going) are read at every seed's evaluations from the first step where all have one to the last
        step every seed reached, each seed at its last evaluation at or before the step. Also epoch by epoch:
        seeds whose evaluations do not overlap yet (one has only its first, after another's last) and a
        progress.csv whose env steps go backwards (no step can be read off it)."""
        steps = [r.column("env_steps") for r in self.runs]
        success = [r.column("test_success_rate") for r in self.runs]
        low, high = max(s[0] for s in steps), min(s[-1] for s in steps)
        uneven = len({len(s) for s in steps}) > 1
        if not (uneven and low <= high and all(np.all(np.diff(s) >= 0) for s in steps)):
            common = self.n_epochs
            return np.mean([s[:common] for s in steps], axis=0), np.stack([s[:common] for s in success])[:, None, :]
        every = np.unique(np.concatenate(steps))
        grid = every[(every >= low) & (every <= high)]
        latest = [np.searchsorted(s, grid, side="right") - 1 for s in steps]
        return grid, np.stack([s[index] for s, index in zip(success, latest)])[:, None, :]


def find_runs(paths: list[Path]) -> list[Run]:
    """The runs under ``paths`` that have finished an epoch; ValueError for a path that holds no run."""
    runs = []
    for path in paths:
        if not path.exists():
            raise ValueError(f"{str(path)!r} does not exist")
        found = [path] if (path / "progress.csv").is_file() else sorted(p.parent for p in path.rglob("progress.csv"))
        if not found:
            raise ValueError(f"no runs under {str(path)!r} (expected run directories with a progress.csv)")
        for run_dir in found:
            rows = read_progress(run_dir)
            if not rows:
                continue  # a run that has not finished its first epoch
            config_path = run_dir / "config.yaml"
            config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
            runs.append(Run(run_dir, rows, config, sweep_label(run_dir)))
    return runs


def sweep_label(run_dir: Path) -> str | None:
    """The sweep's recipe name and its --set values (sweep.json), e.g. 'fetch_push_td3 algo.n_step=3'."""
    description = run_dir / "sweep.json"
    if not description.is_file():
        return None
    data = json.loads(description.read_text())
    shown = [o for o in data.get("overrides", []) if not o.startswith(("log.", "checkpoint.", "train.n_epochs="))]
    return " ".join([data["name"], *shown])


def with_current_defaults(config: dict) -> dict:
    """The run's settings as today's code reads them: keys added since the run was written take
    their defaults and old key names their new ones, so runs of one recipe written by different
    versions of the package still group together. Unreadable configs are compared as written."""
    from her_mpi.config import config_from_dict

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated names: the run was fine when it ran
            return config_from_dict(config).to_dict()
    except (TypeError, ValueError, KeyError):  # ConfigError is a ValueError
        return json.loads(json.dumps(config))  # a deep copy


def recipe_key(run: Run) -> str:
    config = with_current_defaults(run.config)
    for path in NOT_RECIPE:
        node = config
        for key in path[:-1]:
            node = node.get(key, {})
        node.pop(path[-1], None)
    return json.dumps(config, sort_keys=True) + f"|np={run.n_ranks}"


def default_label(run: Run) -> str:
    algo = run.config.get("algo", {})
    name = algo.get("name", "?") + ("+kfac" if algo.get("optimizer") == "kfac" else "")
    return f"{run.config.get('env', {}).get('id', run.path.name)} {name}"


def group(runs: list[Run]) -> list[Recipe]:
    recipes: dict[str, Recipe] = {}
    for run in runs:
        key = recipe_key(run)
        if key not in recipes:
            recipes[key] = Recipe(run.name or default_label(run))
        recipes[key].runs.append(run)
    labels: dict[str, int] = {}
    for recipe in recipes.values():  # the same name for different settings: number them
        labels[recipe.label] = labels.get(recipe.label, 0) + 1
        if labels[recipe.label] > 1:
            recipe.label += f" ({labels[recipe.label]})"
    for recipe in recipes.values():
        recipe.label += f" (np={recipe.runs[0].n_ranks}, {len(recipe.runs)} seed{'s' * (len(recipe.runs) > 1)})"
    return list(recipes.values())


def iqm_curve(scores: np.ndarray, reps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """IQM over runs at every point and its 95% stratified bootstrap interval [2, points]."""
    from rliable import library as rly
    from scipy import stats

    def iqm(s: np.ndarray) -> np.ndarray:  # rliable's aggregate_iqm (over runs x tasks) at every point at once
        return stats.trim_mean(s.reshape(-1, s.shape[-1]), proportiontocut=0.25, axis=0)

    # rliable's StratifiedBootstrap draws its resampling indices from numpy's GLOBAL generator (its
    # random_state only reaches arch), so seed that for the call and give the caller's state back:
    # otherwise an interval depends on whatever drew random numbers earlier in the process
    outer_state = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():  # arch 7 deprecates the RandomState rliable passes (arch 8 rejects it)
            warnings.simplefilter("ignore", FutureWarning)
            point, interval = rly.get_interval_estimates({"recipe": scores}, iqm, reps=reps,
                                                         random_state=np.random.RandomState(seed))
    finally:
        np.random.set_state(outer_state)
    return point["recipe"], interval["recipe"]


def parse_env_steps(text: str) -> int:
    """'300000', '300_000', '300k' or '1.5M' -> env steps (an argparse type)."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text.strip()[-1:].lower(), 1)
    number = text.strip()[:-1] if scale > 1 else text.strip()
    try:
        steps = float(number.replace("_", "")) * scale
    except ValueError:
        steps = float("nan")
    if not (steps >= 1 and steps == int(steps)):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of env steps such as 300000, 300k or 1.5M")
    return int(steps)


def parse_span_edges(text: str) -> tuple[int, ...]:
    """'250k,500k,1M' -> increasing env-step edges (an argparse type)."""
    edges = tuple(parse_env_steps(part) for part in text.split(","))
    if list(edges) != sorted(set(edges)):
        raise argparse.ArgumentTypeError(f"{text!r}: expected increasing env steps such as 250k,500k,1M")
    return edges


def span_means(run: Run, edges: tuple[int, ...]) -> list[dict]:
    """Test and train success averaged over the run's evaluations in [0, e1), [e1, e2), ..., [e_n, its end];
    a span without evaluations has None (the run stopped before it)."""
    steps, test, train = (run.column(key) for key in ("env_steps", "test_success_rate", "train_success_rate"))

    def mean(values: np.ndarray) -> float | None:
        return None if np.isnan(values).all() else float(np.nanmean(values))  # also None when empty

    bounds = (0, *edges, None)
    spans = []
    for low, high in zip(bounds, bounds[1:]):
        inside = (steps >= low) & (steps < (np.inf if high is None else high))
        spans.append({"from": low, "to": high, "evaluations": int((inside & ~np.isnan(test)).sum()),
                      "test": mean(test[inside]), "train": mean(train[inside])})
    return spans


def at_budget(recipe: Recipe, budget: int, reps: int) -> dict:
    """The IQM and interval over each seed's last evaluation at or before ``budget`` env steps; None when
    a seed stops more than 1% short of it (a seed that stops just short of its budget still counts here,
    while the curve ends at the last step every seed reached)."""
    picked = []
    for run in recipe.runs:
        steps = run.column("env_steps")
        index = np.nonzero(steps <= budget)[0]
        if steps[-1] < 0.99 * budget or not len(index):
            return {"budget_env_steps": budget, "env_steps": None, "iqm_success": None, "ci95": None}
        picked.append((steps[index[-1]], run.column("test_success_rate")[index[-1]]))
    steps, scores = np.array(picked).T
    point, interval = iqm_curve(scores[:, None, None], reps)
    return {"budget_env_steps": budget, "env_steps": int(np.mean(steps)), "iqm_success": float(point[-1]),
            "ci95": [float(interval[0][-1]), float(interval[1][-1])]}


def first_crossing(steps: np.ndarray, curve: np.ndarray, threshold: float) -> int | None:
    reached = np.nonzero(curve >= threshold)[0]
    return int(steps[reached[0]]) if len(reached) else None


def summarise(recipe: Recipe, reps: int, at: tuple[int, ...] = (), spans: tuple[int, ...] = ()) -> dict:
    steps, scores = recipe.aligned()
    curve, interval = iqm_curve(scores, reps)
    seconds_per_100k = [float(r.column("time_s")[-1] / r.column("env_steps")[-1] * 1e5) for r in recipe.runs]
    first = recipe.runs[0]
    test_episodes = first.column("test_episodes")[-1] if "test_episodes" in first.rows[-1] else np.nan
    return {
        "recipe": recipe.label, "env": first.config.get("env", {}).get("id"),
        "algo": default_label(first).split(" ", 1)[-1],
        "seeds": sorted(r.seed for r in recipe.runs if r.seed is not None),
        "n_ranks": first.n_ranks, "epochs": recipe.n_epochs,
        "epochs_per_seed": [len(r.rows) for r in recipe.runs],
        "budget_env_steps": int(steps[-1]),
        "iqm_success": float(curve[-1]), "ci95": [float(interval[0][-1]), float(interval[1][-1])],
        **{f"steps_to_{t}": first_crossing(steps, curve, t) for t in THRESHOLDS},
        "at": [at_budget(recipe, budget, reps) for budget in at],
        "seconds_per_100k_env_steps": float(np.median(seconds_per_100k)),
        "test_episodes_per_eval": None if np.isnan(test_episodes) else int(test_episodes),
        "curve": {"env_steps": [int(s) for s in steps], "iqm": [float(v) for v in curve],
                  "ci95_low": [float(v) for v in interval[0]], "ci95_high": [float(v) for v in interval[1]],
                  "per_seed": {str(r.seed): [float(v) for v in r.column("test_success_rate")] for r in recipe.runs},
                  "per_seed_env_steps": {str(r.seed): [int(v) for v in r.column("env_steps")] for r in recipe.runs}},
        "runs": [str(r.path) for r in recipe.runs],
        "spans": {str(r.seed): span_means(r, spans) for r in recipe.runs} if spans else {},
    }


def runs_relative_to(summary: dict, folder: Path) -> dict:
    """The summary with its run paths relative to folder (where its JSON is written), so the file still
    points at its runs after the checkout moves to another machine or directory."""
    return {**summary, "runs": [os.path.relpath(Path(run).resolve(), folder.resolve()) for run in summary["runs"]]}


def short_label(summary: dict) -> str:
    return summary["recipe"].split(" (np=")[0]


def markdown_table(summaries: list[dict]) -> str:
    def steps(value):
        if value is None:
            return "not reached"
        return f"{value / 1000:,.0f}k" if value >= 100_000 else f"{value / 1000:.3g}k"

    def iqm(value, interval):
        return "runs too short" if value is None else f"{value:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"

    budgets = [a["budget_env_steps"] for a in summaries[0].get("at", [])] if summaries else []
    lines = ["| recipe | seeds | ranks | budget (env steps) | IQM success [95% CI] | "
             + "".join(f"IQM at {steps(b)} | " for b in budgets) + "to 0.5 | to 0.8 | to 0.9 | s / 100k steps |",
             "|---|---|---|---|---|" + "---|" * len(budgets) + "---|---|---|---|"]
    for s in summaries:
        lines.append(f"| {short_label(s)} | {len(s['seeds'])} ({', '.join(map(str, s['seeds']))}) | "
                     f"{s['n_ranks']} | {s['budget_env_steps'] / 1000:,.0f}k | {iqm(s['iqm_success'], s['ci95'])} | "
                     + "".join(f"{iqm(a['iqm_success'], a['ci95'])} | " for a in s.get("at", []))
                     + f"{steps(s['steps_to_0.5'])} | {steps(s['steps_to_0.8'])} | {steps(s['steps_to_0.9'])} | "
                     f"{s['seconds_per_100k_env_steps']:,.0f} |")
    return "\n".join(lines) + "\n"


def span_table(summaries: list[dict]) -> str:
    """Per seed, 'test / train (evaluations)' averaged over each span; '' when no summary has spans."""
    with_spans = [s for s in summaries if s.get("spans")]
    if not with_spans:
        return ""

    def edge(steps):
        return f"{steps / 1e6:g}M" if steps >= 1_000_000 else f"{steps / 1000:g}k"

    first = next(iter(with_spans[0]["spans"].values()))
    heads = [f"< {edge(span['to'])}" if span["from"] == 0 else f">= {edge(span['from'])}" if span["to"] is None
             else f"{edge(span['from'])}-{edge(span['to'])}" for span in first]

    def cell(span):
        if span["test"] is None:
            return "-"
        train = "" if span["train"] is None else f" / {span['train']:.2f}"
        return f"{span['test']:.2f}{train} ({span['evaluations']})"

    lines = ["Test / train success averaged over each span of env steps (evaluations in it):", "",
             "| recipe | seed | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(heads)]
    for summary in with_spans:
        for seed, spans in summary["spans"].items():
            lines.append(f"| {short_label(summary)} | {seed} | " + " | ".join(map(cell, spans)) + " |")
    return "\n" + "\n".join(lines) + "\n"


def plot(recipes: list[Recipe], summaries: list[dict], output: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for recipe, summary in zip(recipes, summaries):
        curve = summary["curve"]
        # a label of many --set overrides wraps: unwrapped, tight_layout shrinks the axes to make room for it
        line, = ax.plot(curve["env_steps"], curve["iqm"], marker="o", markersize=2.5,
                        label=textwrap.fill(recipe.label, 90))
        if len(recipe.runs) > 1:
            ax.fill_between(curve["env_steps"], curve["ci95_low"], curve["ci95_high"], color=line.get_color(),
                            alpha=0.2, linewidth=0)
    ax.set_xlabel("environment steps (all ranks)")
    ax.set_ylabel("test success rate (IQM over seeds, 95% CI)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(textwrap.fill(title, 80), fontsize=10)  # long titles wrap instead of running off the PNG
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m her_mpi.plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="run directories or directories holding runs")
    parser.add_argument("--output", "-o", type=Path, default=Path("success.png"),
                        help="image to write (default success.png; .svg, .pdf and others too)")
    parser.add_argument("--table", type=Path, metavar="PREFIX", help="also write PREFIX.md and PREFIX.json")
    parser.add_argument("--title", default="Test success rate")
    parser.add_argument("--at", type=parse_env_steps, action="append", default=[], metavar="STEPS",
                        help="also report the IQM at this many env steps (e.g. 300k; repeatable)")
    parser.add_argument("--spans", type=parse_span_edges, default=(), metavar="EDGES",
                        help="also report each seed's success averaged over spans split at these env steps "
                             "(e.g. 250k,500k,1M)")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap replications (default 2000)")
    args = parser.parse_args(argv)
    if args.reps < 100:
        parser.error(f"--reps {args.reps}: expected at least 100 bootstrap replications")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()  # what savefig can write
    if not args.output.suffix and not args.output.is_dir():
        args.output = args.output.with_suffix(".png")  # as savefig would name it
    if args.output.is_dir() or args.output.suffix.lstrip(".").lower() not in formats:
        parser.error(f"--output {str(args.output)!r}: expected an image file name ending in one of "
                     f"{', '.join('.' + f for f in sorted(formats))}")
    try:
        runs = find_runs(args.paths)
    except ValueError as exc:
        parser.error(str(exc))
    if not runs:
        parser.error(f"no run under {', '.join(map(str, args.paths))} has finished an epoch yet "
                     f"(its progress.csv has no rows)")
    folders = [("--output", args.output.parent)] + ([("--table", args.table.parent)] if args.table else [])
    for flag, folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)  # before anything is written
        except OSError as exc:
            parser.error(f"{flag}: cannot make its folder {str(folder)!r} ({exc.strerror}; is a part of it a file?)")
    recipes = group(runs)
    summaries = [summarise(recipe, args.reps, tuple(args.at), args.spans) for recipe in recipes]
    plot(recipes, summaries, args.output, args.title)
    print(f"wrote {args.output}")
    table = markdown_table(summaries) + span_table(summaries)
    print(table, end="")
    if args.table:
        markdown, data = Path(f"{args.table}.md"), Path(f"{args.table}.json")
        markdown.write_text(table)
        data.write_text(json.dumps({"recipes": [runs_relative_to(s, data.parent) for s in summaries]}, indent=1))
        print(f"wrote {markdown} and {data}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
