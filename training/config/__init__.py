"""The run configuration: a typed schema (Hydra structured configs of frozen dataclasses), composed from conf/ and
checked once, at the door.

Types, defaults and allowed values (enums) live in the dataclasses, each field with its meaning as a comment and each
section with a `check` of its own values beside its fields:
  model.py       model (its options: models/config.py)  loop.py     train, logging, checkpoint
  optimizer.py   optimizer and its lr_config            system.py   system
  stages.py      train.stages                           mixture.py  dataset.mixture's sources and their checks
  root.py        Config: the top-level keys, the checks across sections, values derived from the config
The dataset and data sections are data/config.py's (a source's section is its class there).
conf/*.yaml holds presets only (a group's options, and in config.yaml what the default run changes in them).
compose.py turns YAML and overrides into the checked `Config` (`load_config`, `finish`); nodes.py goes between it and
OmegaConf (plain data, YAML, one-line errors). The config never changes once checked; derived values (global batch,
schedule length) are computed where they are used.
"""

from data.config import AugmentationConfig, DataConfig, DatasetConfig, NotesTokenizerConfig, TokenizerKind
from training.config.compose import compose_config, composition_error, finish, load_config, null_group_choice, to_config
from training.config.loop import (
    CheckpointConfig,
    LoadMode,
    LoggingConfig,
    Progress,
    TrainConfig,
    WandbFallback,
    WandbMode,
    load_file_step,
)
from training.config.mixture import mixture_sources
from training.config.model import Attention, ModelConfig, Remat
from training.config.nodes import CONF_DIR, as_dict, flat_hparams, schema_node, to_yaml
from training.config.optimizer import LrConfig, OptimizerConfig, Schedule
from training.config.root import (
    Config,
    LossMasking,
    Mode,
    Stage,
    check_devices,
    check_new_run,
    context_size,
    evaluating,
    init_from_dir,
    listed_save_steps,
    load_mode,
    schedule_steps,
)
from training.config.system import Dtype, Sharding, SystemConfig

__all__ = [
    "compose_config",
    "composition_error",
    "null_group_choice",
    "finish",
    "check_new_run",
    "load_config",
    "to_config",
    "AugmentationConfig",
    "DataConfig",
    "DatasetConfig",
    "NotesTokenizerConfig",
    "TokenizerKind",
    "CheckpointConfig",
    "LoadMode",
    "LoggingConfig",
    "Progress",
    "TrainConfig",
    "WandbFallback",
    "WandbMode",
    "load_file_step",
    "mixture_sources",
    "Attention",
    "ModelConfig",
    "Remat",
    "CONF_DIR",
    "as_dict",
    "flat_hparams",
    "schema_node",
    "to_yaml",
    "LrConfig",
    "OptimizerConfig",
    "Schedule",
    "Config",
    "LossMasking",
    "Mode",
    "Stage",
    "check_devices",
    "context_size",
    "evaluating",
    "init_from_dir",
    "listed_save_steps",
    "load_mode",
    "schedule_steps",
    "Dtype",
    "Sharding",
    "SystemConfig",
]
