"""A trained model back from its checkpoint, with its tokenizer and config: what sampling, evaluation and export
scripts start from."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import equinox as eqx
import jax
from omegaconf import OmegaConf

from data import Data, make_data
from data.corpus import load_corpus
from data.tokenizers import Tokenizer, tokenizer_from_json
from models import MODEL_BUILDERS
from models.config import Attention
from models.gpt import GPT
from training import config as config_lib
from training.checkpoints.checkpointer import Checkpointer
from training.checkpoints.fit import eval_as_logged
from training.checkpoints.locate import find_checkpoint_dir, run_dir_of
from training.config import Config, to_config
from training.config.legacy import read_earlier_values, upgrade_saved
from training.config.stages import final_model, model_after


@dataclass
class Trained:
    model: GPT
    tokenizer: Tokenizer
    cfg: Config
    step: int
    meta: dict
    run_dir: Path  # where a tool writes what it makes of the run (locate.run_dir_of)


def add_checkpoint_arguments(parser: argparse.ArgumentParser, path: str = "path") -> None:
    """The arguments of a script that reads a trained model: the run (or checkpoint) directory and which step."""
    parser.add_argument(path, help="run directory or checkpoint directory")
    parser.add_argument("--which", default="latest", help="latest, best or a step number")


def load_trained(path: str, which: str = "latest", keys: tuple[str, str] = ("path", "--which")) -> Trained:
    """`path`: a run directory or its checkpoint directory; `which`: latest, best or a step number; `keys`: the tool's
    names for the two, in its messages."""
    reader = Checkpointer(find_checkpoint_dir(path, keys), read_only=True)
    step = reader.resolve(which, keys)
    meta = reader.read_meta(step)
    cfg = to_config(read_earlier_values(upgrade_saved(OmegaConf.create(meta["config"]))))  # as a resume reads it
    if cfg.model.attention == Attention.cudnn:  # a kernel, not weights: the same model where cuDNN's does not run
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention=Attention.auto))
    tokenizer = tokenizer_from_json(meta["tokenizer"])
    builder = MODEL_BUILDERS[cfg.model.arch]
    abstract = eqx.filter_eval_shape(builder, final_model(cfg), tokenizer.vocab_size, jax.random.PRNGKey(0))
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), abstract)
    model = model_after(reader.restore_model(step, like), cfg, step)  # as its step's stage read it (train.stages)
    return Trained(model, tokenizer, cfg, step, meta, run_dir_of(reader.directory, meta))


def run_data(trained: Trained) -> Data:
    """The run's own data, rebuilt from its config and tokenizer in this one process: each validation split's fixed
    batches are the global ones the run evaluated (`train.batch_size` rows from each of its processes)."""
    cfg = trained.cfg
    processes = trained.meta.get("process_count") or cfg.system.num_processes or 1  # older metadata: the config's
    cfg = eval_as_logged(cfg, {**trained.meta, "process_count": processes}, 1)
    corpus = load_corpus(cfg.dataset, config_lib.mixture_sources(cfg.dataset))
    return make_data(cfg, corpus, trained.tokenizer, config_lib.context_size(cfg), 0, 1)
