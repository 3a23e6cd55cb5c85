"""From conf/ and the command line to the typed, checked `Config`.

Hydra composes conf/config.yaml with its override grammar (`model=gpt2 optimizer/lr_config=cosine
train.batch_size=8`) onto the schema: train_jax.py is a Hydra application (training/cli/app.py), and
`load_config(overrides)` does the same through Hydra's compose API for scripts and tests. Either way `finish` turns
the composed node into the typed `Config` (unknown keys and wrong types fail there) and runs every check on its
values. Every failure is a `ConfigError` whose one-line message names the key.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import typing

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.checks import refuse_non_finite
from core.errors import ConfigError
from data.config import SOURCE_CONFIGS, dataset_schema
from training.config.legacy import read_earlier_values
from training.config.loop import LoadMode
from training.config.nodes import CONF_DIR, dotted_group, one_line, schema_node, unknown_key_hint
from training.config.root import Config, check_across, check_devices, check_new_run, load_mode
from training.config.stages import plan_stages

ConfigStore.instance().store(name="base_config", node=schema_node(Config))  # conf/config.yaml's first default
# Each dataset preset's first default (conf/dataset/*.yaml: `/dataset_schema_<source>@_here_`): its source's class.
# Configs, not a group: nothing to choose on the command line (`dataset=...` chooses), none listed by --help.
for _source, _schema in SOURCE_CONFIGS.items():
    ConfigStore.instance().store(name=f"dataset_schema_{_source}", node=schema_node(_schema))


def load_config(overrides: list[str], num_local_devices: int | None = None) -> Config:
    """conf/config.yaml with command-line overrides, typed and checked (see `finish` for `num_local_devices`).

    A pure function of conf/'s files and the arguments: a process that loads the same overrides again (a sweep's
    driver, a notebook, the test suite) gets a copy of the first result while no file of conf/ has changed, instead
    of composing again (0.1-0.15 s); the checks that need the devices run each time. Failures are not kept: each
    call raises its own `ConfigError`."""
    key = (tuple(overrides), _conf_files())
    if key not in _LOADED:
        if len(_LOADED) >= 256:
            _LOADED.clear()
        _LOADED[key] = finish(compose_config(overrides))
    cfg = copy.deepcopy(_LOADED[key])
    if num_local_devices is not None:
        check_devices(cfg, num_local_devices)  # as `finish` would: its last check, which asks the backend
    return cfg


_LOADED: dict[tuple, Config] = {}


def _conf_files() -> tuple:
    """What `load_config`'s results depend on besides its arguments: each file of conf/, its size and mtime."""
    return tuple((str(p), (st := p.stat()).st_mtime_ns, st.st_size) for p in sorted(CONF_DIR.rglob("*.yaml")))


def compose_config(overrides: list[str]) -> DictConfig:
    """conf/config.yaml with command-line overrides, as Hydra composes it onto the schema (types are checked).

    Hydra composes in two phases: the configs that the group overrides choose (`model=gpt2`,
    `optimizer/lr_config=cosine`), then every other override set onto the result, in order. A process keeps the
    first phase's result for each choice of groups while no file of conf/ changes (`_chosen`), and runs the second
    for each new list of values with the code Hydra's own pass runs (`ConfigLoaderImpl`'s, Hydra 1.3; tests/
    test_config.py compares the two): a sweep's driver or the test suite composing many variations of a few presets
    pays Hydra's 0.15-0.35 s once per choice, then 0.02 s (BENCHMARKS.md "Start-up of a short run, and how the test
    suite compiles")."""
    if problem := null_group_choice(overrides):
        raise problem
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        if any(o.is_hydra_override() for o in parsed):
            return _compose(list(overrides))  # Hydra's own settings: not kept
        ConfigLoaderImpl.validate_sweep_overrides_legal(parsed, RunMode.RUN, from_shell=False)
        groups, values = [], []
        for o in parsed:
            (groups if _chooses_a_config(o) else values).append(o)
        composed = copy.deepcopy(_chosen(tuple(o.input_line for o in groups), _conf_files()))
        ConfigLoaderImpl._apply_overrides_to_config(values, composed)
        return composed
    except (HydraException, OmegaConfBaseException) as e:
        raise composition_error(e, overrides) from None


def _chooses_a_config(override: Override) -> bool:
    """A group override (`model=gpt2`, `+recipe=speedrun`, `~recipe`): its key names a folder of conf/, and its value
    is not a dict (`model={n_layer:2}` sets values, in its place among the others, as Hydra reads it)."""
    return (CONF_DIR / override.key_or_group).is_dir() and not isinstance(override.value(), dict)


@functools.lru_cache(maxsize=64)
def _chosen(groups: tuple[str, ...], conf_files: tuple) -> DictConfig:
    """Hydra's composition of conf/config.yaml with group overrides alone (never changed: callers copy it), for
    `compose_config`; `conf_files` (`_conf_files()`) keys it to conf/'s files as they are."""
    return _compose(list(groups))


def _compose(overrides: list[str], hydra: bool = False) -> DictConfig:
    """conf/config.yaml with `overrides`, as Hydra's compose API gives it; `hydra`: with Hydra's own section."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="config", overrides=overrides, return_hydra_config=hydra)


def hydra_settings(overrides: list[str]) -> DictConfig:
    """Hydra's own section (`hydra.sweeper`, `hydra.launcher`, ...) as these overrides compose it."""
    return _compose(overrides, hydra=True).hydra


def null_group_choice(overrides: list[str]) -> ConfigError | None:
    """`recipe=null` (conf/config.yaml shows `recipe: null` for none): Hydra's own words were `Config group override
    must be a string or a list. Got NoneType`, naming neither the group nor a fix."""
    for line in overrides:
        try:
            (o,) = OverridesParser.create().parse_overrides([line])
        except HydraException:
            continue  # said by the composition, in its own words
        group = CONF_DIR / o.key_or_group
        if o.value() is None and not o.is_delete() and group.is_dir():
            options = sorted(p.stem for p in group.glob("*.yaml"))
            return ConfigError(
                f"config: {o.key_or_group}=null: a group takes one of its options ({', '.join(options)}); leave it "
                "out for conf/config.yaml's choice (none for recipe)"
            )
    return None


def composition_error(e: BaseException, overrides: list[str]) -> ConfigError:
    """A failure to compose the config (an override that does not parse, an unknown key or option, a wrong type) as
    one line naming the argument or key: for `compose_config`, and for Hydra's own app (training/cli/app.py)."""
    return ConfigError(_unparsable_override(overrides) or dotted_group(overrides) or one_line(e))


# Keys where inf is a setting, not a mistake: Prodigy's and D-Adaptation's growth_rate (inf, their default: d grows
# without bound)
UNBOUNDED_BY_INF = frozenset({"growth_rate"})


def finish(composed: DictConfig, num_local_devices: int | None = None, saved: bool = False) -> Config:
    """A composed config (Hydra's, or a saved config.yaml) as the typed `Config`, every value checked.

    `num_local_devices`: this process's device count, for the checks that need it (the batch splits over the
    devices, the mesh fits them). None leaves those to `check_devices`, for a caller that cannot ask JAX yet: JAX's
    devices are known only after jax.distributed.initialize, which needs the config's `system` section. `saved`: the
    config of a run that trained (a resume's): the checks of values that trained, if not as meant (an inf clipping
    norm, piecewise points past the end), are a new run's only, so that run resumes and evaluates as it was; for a
    command that asks to resume (checkpoint.load), `check_new_run` waits for plan_run to find nothing to resume.
    """
    cfg = to_config(read_earlier_values(composed))
    if not saved:
        refuse_non_finite(cfg, "", infinite_ok=UNBOUNDED_BY_INF)
    cfg.check()
    check_across(cfg)
    if not saved and load_mode(cfg) == LoadMode.false:  # a resume's: plan_run's, once it knows there is none
        check_new_run(cfg)
    plan_stages(cfg)  # train.stages: every stage at least one step of the run
    if num_local_devices is not None:
        check_devices(cfg, num_local_devices)
    return cfg


def to_config(node: DictConfig | dict) -> Config:
    """`node` merged onto the schema as the typed `Config`, unchecked: unknown keys and wrong types fail here."""
    try:
        node = OmegaConf.create(node) if isinstance(node, dict) else node
        # the dataset section is its source's class (a saved config.yaml says which by its source alone)
        source = OmegaConf.select(node, "dataset.source", default=None)
        composed = OmegaConf.get_type(node, "dataset") if isinstance(node.get("dataset"), DictConfig) else None
        if composed in SOURCE_CONFIGS.values() and composed is not dataset_schema(source):
            raise ConfigError(
                f"config: dataset.source: {source} is chosen with dataset={source} (a preset of conf/dataset/ "
                f"with that source's keys), not by changing the source of dataset={node.dataset.get('name')}"
            )
        _reject_unknown_keys(node, Config, "")
        return OmegaConf.to_object(OmegaConf.merge(_schema(dataset_schema(source)), node))  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        raise ConfigError(one_line(e)) from None


@functools.cache
def _schema(dataset: type) -> DictConfig:
    """The schema's node with `dataset` as its dataset section, built once per process (0.05-0.08 s a build, most of
    `finish`'s time). A template that nothing changes: OmegaConf.merge copies its first config and merges into the
    copy."""
    schema = schema_node(Config)
    schema.dataset = schema_node(dataset)
    return schema


def _unparsable_override(overrides: list[str]) -> str | None:
    """The first argument Hydra's override grammar rejects, named, with how to write it; None when all parse."""
    parser = OverridesParser.create()
    for item in overrides:
        try:
            parser.parse_override(item)
        except HydraException as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return (
                f"config: cannot parse the argument {item!r} ({reason}); write a list whole, e.g. "
                "'train.batch_size=[1,2]', and quote a value with spaces, commas or brackets for Hydra inside the "
                "shell's quotes: 'key=\"a, b\"'"
            )
    return None


def _reject_unknown_keys(node: DictConfig, schema: type, prefix: str) -> None:
    """`+key=value` overrides (and old saved configs) may hold keys the schema does not have; nothing would read
    them, so refuse."""
    types = typing.get_type_hints(schema)
    if schema is Config and isinstance(node.get("dataset"), DictConfig):
        types["dataset"] = dataset_schema(node.dataset.get("source"))
    fields = {f.name for f in dataclasses.fields(schema)}
    for key in node.keys():
        if key not in fields:
            raise ConfigError(
                f"config: unknown key '{prefix}{key}' (python train_jax.py --cfg lists every key)"
                f"{unknown_key_hint(prefix + str(key), node, sorted(fields))}"
            )
        if dataclasses.is_dataclass(types[key]) and isinstance(node[key], DictConfig):
            _reject_unknown_keys(node[key], types[key], f"{prefix}{key}.")
