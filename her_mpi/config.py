"""Typed configuration: YAML recipes, ``--set section.key=value`` overrides, validation.

A recipe is a YAML file of sections. Only values that differ from the defaults need to be
written; a recipe may ``inherit:`` another recipe (path relative to itself). The numbers of the
baselines HER recipe live once, as the dataclass defaults below, and the algorithm section is
validated against the parameter class of the algorithm it names.

Every mistake raises :class:`ConfigError` with the dotted key, the bad value and what was
expected, before anything else happens (in particular before any MPI collective).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A user-fixable mistake in a config file, an override or a command-line argument."""


# ---------------------------------------------------------------------------------------------
# Sections shared by every algorithm
# ---------------------------------------------------------------------------------------------


@dataclass
class EnvConfig:
    id: str = "FetchReach-v4"
    kwargs: dict = field(default_factory=dict)  # passed to gymnasium.make / our env constructors
    max_episode_steps: int | None = None  # None: the env's registered horizon

    def validate(self, path: str) -> None:
        check(self.max_episode_steps is None or self.max_episode_steps >= 1,
               f"{path}.max_episode_steps", self.max_episode_steps, "an integer >= 1 or null")


@dataclass
class TrainConfig:
    """The schedule: epochs -> cycles -> (collect episodes, learn); evaluation after each epoch."""

    n_epochs: int = 50
    n_cycles: int = 50
    n_batches: int = 40  # gradient updates per cycle (off-policy algorithms)
    batch_size: int = 256  # per rank
    rollouts_per_rank: int = 2  # parallel episodes each rank collects per cycle
    n_test_episodes: int = 50  # test episodes per evaluation, all ranks together (split evenly)
    n_test_rollouts: int | None = None  # deprecated: test episodes per rank; use n_test_episodes
    seed: int = 0  # every (seed, rank) pair gets its own random streams
    torch_threads: int = 1  # per rank: ranks, not threads, should use the cores
    sync_check_every: int = 100  # updates between checks that all ranks hold identical parameters

    def validate(self, path: str) -> None:
        for name in ("n_epochs", "n_cycles", "batch_size", "rollouts_per_rank", "torch_threads"):
            check(getattr(self, name) >= 1, f"{path}.{name}", getattr(self, name), "an integer >= 1")
        for name in ("n_batches", "n_test_episodes", "seed", "sync_check_every"):
            check(getattr(self, name) >= 0, f"{path}.{name}", getattr(self, name), "an integer >= 0")
        check(self.n_test_rollouts is None or self.n_test_rollouts >= 0, f"{path}.n_test_rollouts",
              self.n_test_rollouts, "an integer >= 0 or null")
        if self.n_test_rollouts is not None:
            warnings.warn(f"{path}.n_test_rollouts (test episodes per rank) is deprecated; use "
                          f"{path}.n_test_episodes (all ranks together)", FutureWarning, stacklevel=2)

    def test_episodes_per_rank(self, n_ranks: int) -> int:
        """Each rank's share of the test episodes (rounded up: every rank runs as many)."""
        if self.n_test_rollouts is not None:  # the deprecated per-rank setting wins if given
            return self.n_test_rollouts
        return -(-self.n_test_episodes // n_ranks)


@dataclass
class ReplayConfig:
    size: int = 1_000_000  # transitions per rank
    strategy: Literal["future", "final", "episode", "random", "none"] = "future"
    replay_k: int = 4  # hindsight goals: a share replay_k / (1 + replay_k + actual_k) of each batch
    # "futureactual" (mrl): a share actual_k / (1 + replay_k + actual_k) of each batch gets the
    # desired goal of another stored transition; 0 (baselines): none
    actual_k: int = 0
    prioritized: bool = False
    alpha: float = 0.6  # priority exponent
    beta: float = 0.4  # initial importance-weight exponent, annealed linearly to 1
    beta_anneal_updates: int = 0  # 0: anneal over the whole run
    priority_eps: float = 1e-6

    def validate(self, path: str) -> None:
        check(self.size >= 1, f"{path}.size", self.size, "an integer >= 1")
        check(self.replay_k >= 0, f"{path}.replay_k", self.replay_k, "an integer >= 0")
        check(self.actual_k >= 0, f"{path}.actual_k", self.actual_k, "an integer >= 0")
        check(0.0 <= self.alpha <= 1.0, f"{path}.alpha", self.alpha, "a number in [0, 1]")
        check(0.0 <= self.beta <= 1.0, f"{path}.beta", self.beta, "a number in [0, 1]")
        check(self.beta_anneal_updates >= 0, f"{path}.beta_anneal_updates",
               self.beta_anneal_updates, "an integer >= 0")
        check(self.priority_eps > 0, f"{path}.priority_eps", self.priority_eps, "a number > 0")


@dataclass
class NormalizerConfig:
    enabled: bool = True
    eps: float = 0.01  # lower bound of the std
    clip: float = 5.0  # normalised inputs are clipped to +-clip
    clip_obs: float = 200.0  # raw observations and goals are clipped to +-clip_obs first

    def validate(self, path: str) -> None:
        for name in ("eps", "clip", "clip_obs"):
            check(getattr(self, name) > 0, f"{path}.{name}", getattr(self, name), "a number > 0")


@dataclass
class CheckpointConfig:
    every: int = 5  # also keep checkpoints/epoch_NNNN.pt every N epochs (0: never)
    # Keep each rank's replay buffer with the checkpoints (checkpoints/replay_rank<r>/), so a resume
    # continues exactly; each save writes only the episodes stored since the previous one.
    # false: a resumed run starts with empty replay buffers.
    save_buffer: bool = True

    def validate(self, path: str) -> None:
        check(self.every >= 0, f"{path}.every", self.every, "an integer >= 0")


@dataclass
class LogConfig:
    tensorboard: bool = True
    print_every: int = 1  # epochs between progress lines
    video_every: int = 0  # rank 0 writes videos/epoch_NNNN.<video_format> every N epochs (0: never)
    video_format: Literal["mp4", "gif"] = "mp4"  # the video file's format (also in TensorBoard as a GIF)
    video_episodes: int = 2  # deterministic test episodes per video (the same goals every time)
    video_width: int = 256  # frame width in pixels (even for mp4)
    video_height: int = 256  # frame height in pixels (even for mp4)

    def validate(self, path: str) -> None:
        check(self.print_every >= 1, f"{path}.print_every", self.print_every, "an integer >= 1")
        check(self.video_every >= 0, f"{path}.video_every", self.video_every, "an integer >= 0 (0: no videos)")
        check(self.video_episodes >= 1, f"{path}.video_episodes", self.video_episodes, "an integer >= 1")
        for name in ("video_width", "video_height"):
            value = getattr(self, name)
            check(16 <= value <= 4096, f"{path}.{name}", value, "an integer in [16, 4096] (pixels)")
            check(self.video_format != "mp4" or value % 2 == 0, f"{path}.{name}", value,
                  "an even number of pixels for video_format mp4 (H.264)")


# Algorithms register their parameter classes by name (her_mpi/algos/__init__.py does it for the
# built-in ones). The config stores the name it was given, so knowing which algorithm a config
# asks for never depends on inspecting types or importing algorithm code.
ALGORITHM_PARAMS: dict[str, type] = {}
BUILTIN_ALGORITHMS = "her_mpi.algos"  # the package whose import registers the built-in algorithms


def register_algorithm(name: str, params_class: type) -> None:
    """Make ``algo: <name>`` valid, with ``params_class`` (a dataclass) as its ``algo`` section."""
    if not dataclasses.is_dataclass(params_class):
        raise TypeError(f"algorithm {name!r}: parameter class {params_class!r} is not a dataclass")
    registered = ALGORITHM_PARAMS.setdefault(name, params_class)
    if registered is not params_class:
        raise ValueError(f"algorithm name {name!r} is already registered with {registered.__name__}")


def algorithm_names() -> list[str]:
    load_builtin_algorithms()
    return sorted(ALGORITHM_PARAMS)


def load_builtin_algorithms() -> None:
    """Register the built-in algorithms: a plugin load by package name on first need (cached by
    Python afterwards). This module never imports algorithm code at import time; algorithm code
    imports this module."""
    importlib.import_module(BUILTIN_ALGORITHMS)


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    algo: Any = None  # an instance of the named algorithm's parameter class
    train: TrainConfig = field(default_factory=TrainConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    normalizer: NormalizerConfig = field(default_factory=NormalizerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # The registered name the recipe gave (``algo.name``); written back as ``algo.name`` by
    # to_dict. Not a recipe key of its own (init=False), so the name has one place in a file.
    algo_name: str = field(default="ddpg", init=False)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["algo"] = {"name": data.pop("algo_name"), **data["algo"]}
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

RECIPES_DIR = Path(__file__).resolve().parent / "configs"  # shipped inside the package
DEFAULT_RECIPE = RECIPES_DIR / "default.yaml"


def recipe_names() -> list[str]:
    """Names of the recipes shipped with the package (``--config NAME`` works for each)."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def resolve_recipe(name_or_path: str | Path | None) -> Path:
    """A recipe file from a path, or from a packaged recipe's name (``fetch_push_td3``).

    ``configs/<name>.yaml`` also finds the packaged recipe from any directory, so commands
    written for the source checkout work after a plain ``pip install``."""
    if name_or_path is None:
        return DEFAULT_RECIPE
    path = Path(name_or_path)
    if path.is_file():
        return path
    text = str(name_or_path)
    stem = path.stem if path.suffix in (".yaml", ".yml") else path.name
    if stem in recipe_names() and (text == stem or path.parent.name == "configs"):
        return RECIPES_DIR / f"{stem}.yaml"
    close = difflib.get_close_matches(stem, recipe_names(), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else \
        " (python -m her_mpi.train --list-recipes lists the packaged recipes)"
    raise ConfigError(f"config file {text!r} does not exist and is not a packaged recipe name{hint}")


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Read a recipe (a path or a packaged recipe's name; the default recipe when None), apply
    overrides, validate."""
    raw = read_recipe(resolve_recipe(path))
    for item in overrides:
        apply_override(raw, item)
    return config_from_dict(raw)


def read_recipe(path: Path, _seen: tuple = ()) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    if path.resolve() in _seen:
        raise ConfigError(f"config file {str(path)!r} inherits from itself")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections, "
                          f"got {type(data).__name__}")
    parent = data.pop("inherit", None)
    if parent is None:
        return data
    base = read_recipe((path.parent / parent), _seen + (path.resolve(),))
    if algo_name_of(data) not in (None, algo_name_of(base)):
        base.pop("algo", None)  # another algorithm: the parent's algorithm parameters don't apply
    return deep_merge(base, data)


def algo_name_of(raw: dict) -> str | None:
    algo = raw.get("algo")
    return algo if isinstance(algo, str) else algo.get("name") if isinstance(algo, dict) else None


def deep_merge(base: dict, update: dict) -> dict:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key != "kwargs":
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def apply_override(raw: dict, item: str) -> None:
    """Apply one ``section.key=value`` override; the value is parsed as YAML (1e-3, true, [1,2])."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    dotted, text = item.split("=", 1)
    keys = dotted.strip().split(".")
    if not all(keys):
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    node = raw
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        elif not isinstance(child, dict):
            if key == "algo" and isinstance(child, str):  # `algo: td3` shorthand in the file
                child = node[key] = {"name": child}
            else:
                raise ConfigError(f"override {item!r}: {key!r} is a value, not a section")
        node = child
    if keys in (["algo"], ["algo", "name"]) and isinstance(value, str):
        if value != algo_name_of(raw):  # switching algorithms starts from the new one's defaults
            raw["algo"] = {"name": value}
        return
    node[keys[-1]] = value


def config_from_dict(raw: dict) -> Config:
    raw = dict(raw)
    algo_raw = raw.pop("algo", None)
    if algo_raw is None:
        algo_raw = {}
    if isinstance(algo_raw, str):
        algo_raw = {"name": algo_raw}
    if not isinstance(algo_raw, dict):
        raise ConfigError(f"algo must be an algorithm name or a mapping, got {algo_raw!r}")
    algo_raw = dict(algo_raw)
    name = algo_raw.pop("name", "ddpg")

    known = algorithm_names()
    if name not in known:
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"algo.name: unknown algorithm {name!r}; known: "
                          f"{', '.join(known)}{hint}")
    config = build_dataclass(Config, raw, "")
    config.algo = build_dataclass(ALGORITHM_PARAMS[name], algo_raw, "algo")
    config.algo_name = name
    validate_tree(config, "")
    return config


def build_dataclass(cls, raw: Any, path: str):
    """Construct ``cls`` from a mapping, rejecting unknown keys and values of the wrong type."""
    where = path or "the config"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in raw.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {(path + '.' if path else '') + close[0]!r}?" if close else ""
            raise ConfigError(f"unknown config key {dotted!r}{hint} "
                              f"(valid keys in {where}: {', '.join(fields)})")
        kwargs[key] = coerce(value, hints[key], dotted)
    return cls(**kwargs)


def coerce(value: Any, hint: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return build_dataclass(hint, value if value is not None else {}, path)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else
                          f"{path}: {value!r} is not a valid {describe(hint)}")
    if origin is Literal:
        if value not in args:
            close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            hint_text = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{path}: {value!r} is not one of "
                              f"{', '.join(repr(a) for a in args)}{hint_text}")
        return value
    if origin is list or hint is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        item = args[0] if args else Any
        return [coerce(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if hint is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {hint!r} at {path}")  # a bug in a Params class


def describe(hint: Any) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return " or ".join(getattr(a, "__name__", str(a)) for a in args) or str(hint)


def validate_tree(node: Any, path: str) -> None:
    """Call ``validate(path)`` on every dataclass in the tree."""
    if not dataclasses.is_dataclass(node):
        return
    for f in dataclasses.fields(node):
        child = getattr(node, f.name)
        validate_tree(child, f"{path}.{f.name}" if path else f.name)
    if hasattr(node, "validate"):
        node.validate(path)


def check(ok: bool, path: str, value: Any, expected: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: got {value!r}, expected {expected}")


