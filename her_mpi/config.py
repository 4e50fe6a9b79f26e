"""Typed configuration: YAML recipes, ``--set section.key=value`` overrides, validation.

A recipe is a YAML file of sections. Only values that differ from the defaults need to be
written; a recipe may ``inherit:`` another recipe (path relative to itself). The numbers of the
baselines HER recipe live once, as the defaults of the section classes, and the algorithm section
is validated against the parameter class of the algorithm it names.

Every mistake raises :class:`ConfigError` with the dotted key, the bad value and what was
expected, before anything else happens (in particular before any MPI collective). That includes
a value given to a key the chosen algorithm would not read (:func:`check_unused`).

Every key is declared once, as a dataclass field made by :func:`~her_mpi.settings.setting`: its
type, its default and a one-line description side by side (the shared sections in
:mod:`her_mpi.settings`, each algorithm's ``algo`` section in its module). ``python -m
her_mpi.train --list-keys`` prints them (:func:`list_keys`).

Why no library for the parsing (pydantic 2.13 was tried on these dataclasses): its lax mode
turns ``true`` into 1 and ``"yes"`` into True and by default drops unknown keys, its strict mode refuses the mapping a dataclass is
read from, and its messages ("Input should be a valid integer", "Unexpected keyword argument")
name neither the nearest key nor the nearest choice, so we would keep the same suggestion code
and add a translation layer and a dependency. tyro builds a CLI of its own (not recipes with
``inherit:`` and ``--set section.key=value``); omegaconf has no unions other than Optional
(``split_preconditioning: bool | Literal["auto"]``). The hand-written coercion below is about 60 lines.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from her_mpi import registry
# The sections and the vocabulary live in her_mpi.settings (algorithms import them from there);
# they are re-exported here, where users of the package look for them.
from her_mpi.settings import (CheckpointConfig, ConfigError, EnvConfig, LogConfig,  # noqa: F401
                              NormalizerConfig, ReplayConfig, TrainConfig, Unused, UnusedSettingWarning,
                              check, key_help, renamed_keys, setting)


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

NEXT_RELEASE = "0.2"  # deprecated key names are accepted until this release
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
        return RECIPES_DIR / f"{stem}.yaml"  # even beside a folder of that name (a sweep's output)
    if path.is_dir():
        raise ConfigError(f"config {text!r} is a directory: expected a recipe file (.yaml) or a packaged recipe name")
    close = difflib.get_close_matches(stem, recipe_names(), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else \
        " (python -m her_mpi.train --list-recipes lists the packaged recipes)"
    raise ConfigError(f"config file {text!r} does not exist and is not a packaged recipe name{hint}")


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Read a recipe (a path or a packaged recipe's name; the default recipe when None), apply
    overrides, validate, and refuse settings the algorithm would ignore (:func:`check_unused`)."""
    recipe = read_recipe(resolve_recipe(path))
    raw = copy.deepcopy(recipe)
    for item in overrides:
        apply_override(raw, item)
    config = config_from_dict(raw)
    if is_resolved_config(recipe):
        # A run's config.yaml: every key written out, with the defaults of the version that wrote
        # it. What it sets is a record of that run, not a choice: warned about, not refused.
        check_unused(config, overrides_tree(overrides))
        check_unused(config, recipe, refuse=False)
    else:
        check_unused(config, raw)
    return config


def is_resolved_config(raw: dict) -> bool:
    """Whether a recipe is a resolved config (Config.to_dict: config.yaml, a checkpoint's config)."""
    return set(SECTIONS) <= set(raw) and isinstance(raw["algo"], dict) and "name" in raw["algo"]


def overrides_tree(overrides: list[str]) -> dict:
    """The keys ``--set`` overrides give, as a nested mapping."""
    tree: dict = {}
    for item in overrides:
        apply_override(tree, item)
    return tree


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

    config = build_dataclass(Config, raw, "")
    config.algo = build_dataclass(params_class(name), algo_raw, "algo")
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
    renamed = renamed_keys(cls)
    kwargs = {}
    for key, value in raw.items():
        if key in renamed:
            key = current_name(raw, key, renamed[key], path)
        dotted = f"{path}.{key}" if path else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {(path + '.' if path else '') + close[0]!r}?" if close else ""
            raise ConfigError(f"unknown config key {dotted!r}{hint} "
                              f"(valid keys in {where}: {', '.join(fields)})")
        kwargs[key] = coerce(value, hints[key], dotted)
    return cls(**kwargs)


def params_class(name: Any) -> type:
    """The ``algo`` section class of the algorithm registered as ``name``."""
    known = registry.algorithm_names()
    if name not in known:
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"algo.name: unknown algorithm {name!r}; known: "
                          f"{', '.join(known)}{hint}")
    return registry.algorithm_class(name).Params


def current_name(raw: dict, old: str, new: str, path: str) -> str:
    """The current name of a deprecated key ``old``: warns, and refuses both names at once."""
    prefix = f"{path}." if path else ""
    if new in raw:
        raise ConfigError(f"{prefix}{old} and {prefix}{new} are the same setting ({old} is its "
                          f"deprecated name); keep only {prefix}{new}")
    warnings.warn(f"{prefix}{old} is deprecated; use {prefix}{new} (the old name is accepted until "
                  f"her_mpi {NEXT_RELEASE})", FutureWarning, stacklevel=2)
    return new


EXPONENT_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


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
        if len(errors) == 1:
            raise ConfigError(errors[0])
        raise ConfigError(f"{path}: expected {describe(hint)}, got {value!r}{nearest_choice(value, hint)}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}: {value!r} is not one of "
                              f"{', '.join(repr(a) for a in args)}{nearest_choice(value, hint)}")
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
    if hint in (int, float) and isinstance(value, str) and EXPONENT_NUMBER.fullmatch(value):
        value = float(value)  # YAML 1.1 reads 3e-4 (no dot in the mantissa) as a string
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


EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping", type(None): "null"}


def describe(hint: Any) -> str:
    """What a value of a union type may be, in words: "true, false or 'auto'"."""
    words = []
    for arg in typing.get_args(hint):
        if typing.get_origin(arg) is Literal:
            words += [repr(choice) for choice in typing.get_args(arg)]
        elif arg is bool:
            words += ["true", "false"]
        else:
            words.append(EXPECTED.get(typing.get_origin(arg) or arg, type_name(arg)))
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else "".join(words)


def nearest_choice(value: Any, hint: Any) -> str:
    """"; did you mean 'auto'?" for a string close to one of the choices of the ``Literal`` types
    in ``hint`` (itself or a member of a union), else ""."""
    literals = [hint] if typing.get_origin(hint) is Literal else typing.get_args(hint)
    choices = {str(c).lower(): c for arg in literals if typing.get_origin(arg) is Literal for c in typing.get_args(arg)}
    close = difflib.get_close_matches(value.lower(), list(choices), n=1) if isinstance(value, str) else []
    return f"; did you mean {choices[close[0]]!r}?" if close else ""


def check_unused(config: Config, given: dict, refuse: bool = True) -> None:
    """Refuse a key that ``given`` (what a recipe and its parents or ``--set`` wrote) sets to a
    value other than its default when the algorithm, with these settings, never reads it (the
    ``unused_keys`` of its ``algo`` section). A key whose :class:`Unused` says ``refuse=False``,
    and every key when ``refuse`` is false, is loaded with an :class:`UnusedSettingWarning`.

    Only what was given is checked, never the rest of a resolved config: a checkpoint's config
    lists every key with the defaults of its time, and loads for resume, export and evaluation."""
    unused_keys = getattr(config.algo, "unused_keys", None)
    unused = unused_keys(config) if unused_keys else {}
    if not unused:
        return
    defaults = Config()
    defaults.algo = type(config.algo)()
    for dotted, value, default in given_values(config, defaults, given, ""):
        why = next((why for key, why in unused.items() if dotted == key or dotted.startswith(key + ".")), None)
        if why is None or value == default:
            continue
        message = (f"{dotted}: {yaml_text(value)} has no effect with algo.name {config.algo_name}: {why.reason}; "
                   f"remove it (default {yaml_text(default)})")
        if refuse and why.refuse:
            raise ConfigError(message)
        warnings.warn(message, UnusedSettingWarning, stacklevel=3)


def given_values(node: Any, default: Any, given: Any, path: str):
    """(dotted key, value in effect, default) of every key ``given`` sets under dataclass ``node``
    (deprecated names counted as their current ones; ``algo.name`` is not a setting)."""
    if not isinstance(given, dict):
        return
    renamed = renamed_keys(type(node))
    for key, raw in given.items():
        key = renamed.get(key, key)
        if key == "algo" and not path and isinstance(raw, str):
            continue  # `algo: td3` names the algorithm
        if not hasattr(node, key) or (path == "algo" and key == "name"):
            continue
        value, default_value, dotted = getattr(node, key), getattr(default, key), f"{path}.{key}" if path else key
        if dataclasses.is_dataclass(value):
            yield from given_values(value, default_value, raw, dotted)
        else:
            yield dotted, value, default_value


def validate_tree(node: Any, path: str) -> None:
    """Call ``validate(path)`` on every dataclass in the tree."""
    if not dataclasses.is_dataclass(node):
        return
    for f in dataclasses.fields(node):
        child = getattr(node, f.name)
        validate_tree(child, f"{path}.{f.name}" if path else f.name)
    if hasattr(node, "validate"):
        node.validate(path)


# ---------------------------------------------------------------------------------------------
# Listing the keys (--list-keys)
# ---------------------------------------------------------------------------------------------

SECTIONS = [f.name for f in dataclasses.fields(Config) if f.init]  # env, algo, train, ...


def list_keys(section: str | None = None, algo: str | None = None) -> str:
    """Key, type, default and description of every key of ``section`` (every section when
    None). The ``algo`` section is that of algorithm ``algo``, or of each algorithm in turn."""
    if section is not None and section not in SECTIONS:
        close = difflib.get_close_matches(section, SECTIONS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"--list-keys: unknown section {section!r}{hint} (sections: {', '.join(SECTIONS)})")
    hints = typing.get_type_hints(Config)
    blocks = []
    for name in (s for s in SECTIONS if section in (None, s)):
        if name != "algo":
            blocks.append((name, section_keys(hints[name], name)))
            continue
        for algo_name in [algo] if algo else registry.algorithm_names():
            params = params_class(algo_name)
            old_names = ", ".join(f"{old} -> {new}" for old, new in renamed_keys(params).items())
            title = f"algo, when algo.name is {algo_name}" + (f" (deprecated: {old_names})" if old_names else "")
            blocks.append((title, section_keys(params, "algo")))
    header = ("key", "type", "default", "description")
    rows = [header] + [row for _, block in blocks for row in block]
    width = [max(len(row[i]) for row in rows) for i in range(3)]

    def line(row):
        return "  ".join(cell.ljust(w) for cell, w in zip(row[:3], width)) + "  " + row[3]

    lines = [line(header)]
    for title, block in blocks:
        lines += ["", f"[{title}]"] + [line(row) for row in block]
    return "\n".join(lines)


def section_keys(cls: type, path: str) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) of a section's keys; nested sections flattened."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in (f for f in dataclasses.fields(cls) if f.init):
        hint, dotted = hints[f.name], f"{path}.{f.name}"
        if dataclasses.is_dataclass(hint):
            rows += section_keys(hint, dotted)
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        rows.append((dotted, type_name(hint), yaml_text(default), key_help(cls, f.name)))
    return rows


def type_name(hint: Any) -> str:
    """A type as a recipe writes it: float, list[int], int | null, 'future' | 'final'."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is Literal:
        return " | ".join(yaml_text(a) for a in args)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # bool | Literal["auto"]: true | false | auto
        return " | ".join("true | false" if a is bool else type_name(a) for a in args)
    if hint is type(None):
        return "null"
    if typing.get_origin(hint) is list:
        return f"list[{type_name(args[0])}]"
    return getattr(hint, "__name__", str(hint))


def yaml_text(value: Any) -> str:
    """A value as it is written in a recipe (null, true, [256, 256], {})."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("\n...\n").strip()
