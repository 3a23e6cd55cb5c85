"""One place per fact: the schema (training/config/) holds every key's type, default, allowed values and meaning;
conf/ holds presets only.

The rules these tests hold conf/ to:
- every key of every YAML in conf/ is a key of the schema section that file fills (conf/hydra/ and the `hydra:`
  section configure Hydra itself);
- conf/config.yaml holds its defaults list, and otherwise only changes to the presets that list picks (dataset,
  model, optimizer and the optimizer's lr_config): each such value differs from the dataclass default and from the
  picked preset's value, and a comment says why (on its line, or on the comment lines right above it or above a
  section holding it). A key of a section no group fills (train, logging, checkpoint, system, the top level) would
  be a second default: its one default is the dataclass's.
- presets (conf/<group>/*.yaml) describe a whole dataset, model, optimizer or schedule, so they may restate a default.
"""

import dataclasses
import inspect
import typing
from pathlib import Path

import yaml

from data.config import SOURCE_CONFIGS, dataset_schema
from optimizers.registry import OWN_KEYS
from training.config import CONF_DIR, Config, as_dict


def schema_at(parts: tuple[str, ...]) -> type:
    """The dataclass of the section at `parts` (e.g. ("optimizer", "lr_config"))."""
    schema = Config
    for part in parts:
        schema = typing.get_type_hints(schema)[part]
    return schema


def unknown_keys(node: dict, schema: type, prefix: str) -> list[str]:
    types = typing.get_type_hints(schema)
    unknown = []
    for key, value in node.items():
        if key in ("defaults", "hydra") and prefix == "":  # Hydra's own: the defaults list and its settings
            continue
        if key not in types:
            unknown.append(f"{prefix}{key}")
        elif dataclasses.is_dataclass(types[key]) and isinstance(value, dict):
            unknown += unknown_keys(value, types[key], f"{prefix}{key}.")
    return unknown


def leaves(node: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def commented(text: str) -> dict[str, bool]:
    """Each key of a YAML file -> whether a comment explains it: on its line, or on the comment lines right above it
    or right above a section that holds it."""
    out, stack, comment_above = {}, [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment_above = True
            continue
        if not stripped or stripped.startswith("-") or ":" not in stripped:
            comment_above = False
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        explained = comment_above or "#" in stripped or any(e for _, _, e in stack)
        stack.append((indent, stripped.split(":", 1)[0], explained))
        out[".".join(k for _, k, _ in stack)] = explained
        comment_above = False
    return out


def picks(defaults: list) -> dict[str, str]:
    """{group: option} of a defaults list."""
    return {k: v for d in defaults if isinstance(d, dict) for k, v in d.items()}


def preset_value(parts: list[str], defaults: list, folder: Path = CONF_DIR) -> tuple[bool, object]:
    """(whether the presets a defaults list picks set the key `parts`, and to what), following the presets' own
    defaults lists (optimizer/adamw.yaml picks its lr_config), where the preset's own keys win as in Hydra."""
    chosen = picks(defaults)
    section, rest = parts[0], parts[1:]
    if section not in chosen or not rest:
        return False, None
    preset = yaml.safe_load((folder / section / f"{chosen[section]}.yaml").read_text()) or {}
    node = preset
    for part in rest:
        if not isinstance(node, dict) or part not in node:
            return preset_value(rest, preset.get("defaults", []), folder / section)
        node = node[part]
    return True, node


def test_every_key_in_conf_is_a_key_of_the_schema():
    files = sorted(p for p in CONF_DIR.rglob("*.yaml") if p.relative_to(CONF_DIR).parts[0] != "hydra")
    assert len(files) > 20
    unknown = {}
    for path in files:
        section = path.relative_to(CONF_DIR).parent.parts
        values = yaml.safe_load(path.read_text()) or {}
        # a dataset preset fills the class of its source's section; a recipe (conf/recipe/, `# @package _global_`)
        # sets keys of the whole config
        found = []
        if section == ("recipe",):
            section = ()
            picks = {
                k.split("/")[-1]: v for d in values.get("defaults", []) if isinstance(d, dict) for k, v in d.items()
            }
            if "dataset" in values:  # the dataset section of the preset the recipe picks (else the default's)
                preset = yaml.safe_load((CONF_DIR / "dataset" / f"{picks.get('dataset', 'pystdlib')}.yaml").read_text())
                found += [
                    f"dataset.{k}" for k in unknown_keys(values.pop("dataset"), dataset_schema(preset["source"]), "")
                ]
        schema = dataset_schema(values["source"]) if section == ("dataset",) else schema_at(section)
        found += unknown_keys(values, schema, "")
        if found:
            unknown[str(path.relative_to(CONF_DIR))] = found
    assert not unknown, f"keys the schema does not have: {unknown}"


def test_config_yaml_only_changes_the_presets_it_picks_each_on_purpose():
    text = (CONF_DIR / "config.yaml").read_text()
    base = yaml.safe_load(text)
    groups = picks(base["defaults"])
    defaults = as_dict(Config())
    explained = commented(text)
    problems = []
    for key, value in leaves({k: v for k, v in base.items() if k not in ("defaults", "hydra")}).items():
        default = defaults
        for part in key.split("."):
            default = default[part]
        in_preset, preset = preset_value(key.split("."), base["defaults"])
        if key.split(".")[0] not in groups:
            problems.append(f"{key}: no group fills this section, so its default is the dataclass's: set it there")
        elif value == default:
            problems.append(f"{key}: {value!r} repeats the dataclass default")
        elif in_preset and value == preset:
            problems.append(f"{key}: {value!r} repeats the preset's value")
        elif not explained.get(key):
            problems.append(
                f"{key}: {value!r} differs from the dataclass default {default!r} without a comment saying why"
            )
    assert not problems, "\n".join(problems)


def schema_classes(schema: type = Config) -> list[type]:
    classes = [schema]
    for sub in typing.get_type_hints(schema).values():
        # the dataset section is the class of its source: each of them
        for section in [sub, *SOURCE_CONFIGS.values()] if hasattr(sub, "schema_for") else [sub]:
            if dataclasses.is_dataclass(section):
                classes += [c for c in schema_classes(section) if c not in classes]
    return classes


def test_every_field_of_the_schema_says_what_it_means_in_a_comment():
    """The convention `--help` reads: a trailing comment, or comment lines right above the field."""
    silent = []
    for schema in schema_classes():
        for f in dataclasses.fields(schema):
            if f.name in OWN_KEYS:  # an optimizer's own hyper-parameter, added at run time: its builder's argument
                continue
            owner = next(c for c in schema.__mro__ if f.name in c.__dict__.get("__annotations__", {}))
            lines = inspect.getsource(owner).splitlines()
            at = next(i for i, line in enumerate(lines) if line.startswith(f"    {f.name}:"))
            if "#" not in lines[at] and not lines[at - 1].strip().startswith("#"):
                silent.append(f"{schema.__name__}.{f.name}")
    assert len(schema_classes()) == 21  # Config and its sections (the dataset's, one per source), nested ones included
    assert not silent, f"fields without a comment: {silent}"
