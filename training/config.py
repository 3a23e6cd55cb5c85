"""The run configuration: typed schema (Hydra structured configs), composition from conf/, one validation pass.

Values live in conf/*.yaml; types and defaults live here. `load_config(overrides)` composes the YAML with Hydra's
override grammar (`model=gpt2 optimizer/lr_config=cosine train.batch_size=8`), merges it onto the schema (unknown
keys and wrong types fail there), then `validate` checks values. Every failure is a `ConfigError` whose message names
the key. The config is never mutated afterwards; derived values (global batch, decay steps) are computed where used.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from training.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
NOTE_SOURCES = ("music21", "maestro", "midi_files")


@dataclass
class AugmentationConfig:
    """Notes only, training records only; drawn per record from (seed, sample), so a resumed run sees the same."""

    speed_change_factors: list[float] = field(default_factory=list)  # e.g. [0.9, 1.1]: also play records this fast
    max_pitch_shift: int = 0  # transpose each record by up to this many semitones either way


@dataclass
class NotesTokenizerConfig:
    time_step: float = 0.01  # seconds per SHIFT / DUR step
    max_shift_steps: int = 100  # largest single SHIFT token; longer gaps take several
    max_duration_steps: int = 100  # largest single DUR token; longer notes take several
    velocity_bins: int = 32


@dataclass
class DatasetConfig:
    name: str = "pystdlib"  # label used in run names
    source: str = "pystdlib"  # pystdlib | text_files | json_files | hf (text); music21 | maestro | midi_files (notes)
    tokenizer: str = "bpe"  # byte | bpe | gpt2 (text) | notes
    bpe_vocab_size: int = 4096  # bpe only: size including the byte alphabet and special tokens
    context_size: Optional[int] = None  # tokens per training window; null = model.context_size
    val_fraction: float = 0.05  # sources without their own splits: share of documents held out per split
    test_fraction: float = 0.05
    extra_val_splits: list[str] = field(default_factory=list)  # pystdlib: packages held out whole, one split each
    files: list[str] = field(default_factory=list)  # text_files: paths, directories or globs
    hf_path: Optional[str] = None  # hf: Hub dataset id, e.g. Salesforce/wikitext
    hf_name: Optional[str] = None  # hf: dataset config name, e.g. wikitext-2-raw-v1
    text_column: str = "text"
    prompt_column: Optional[str] = None  # text fine-tuning: records are `prompt <GENAI> completion` from these two
    completion_column: Optional[str] = None
    train_split: str = "train"
    val_split: Optional[str] = "validation"  # hf: null = hold out val_fraction of the train split
    test_split: Optional[str] = "test"
    streaming: bool = False  # hf: stream instead of downloading the whole dataset (needs max_documents)
    max_documents: Optional[int] = None  # cap on documents per split (streamed corpora: documents read in all)
    num_proc: int = 2  # processes for tokenising with datasets.map (and for parsing scores / MIDI files)
    cache_dir: str = ".cache"  # tokenised datasets, trained tokenizers, parsed notes
    # Notes (music21 | maestro | midi_files):
    composers: list[str] = field(default_factory=lambda: ["bach", "mozart", "beethoven", "chopin"])  # music21
    max_pieces_per_composer: Optional[int] = None  # music21: the smallest files first; null = all
    eval_composers: list[str] = field(default_factory=lambda: ["bach", "mozart", "beethoven", "chopin"])
    default_velocity: int = 80  # scores: velocity before the first dynamic mark
    base_dataset_name: Optional[str] = None  # maestro: Hub id or local folder giving validation and test
    extra_datasets: list[str] = field(default_factory=list)  # maestro: their train splits train (default: base's)
    pause_detection_threshold: float = 4.0  # seconds of silence that split a piece into segments
    augmentation: AugmentationConfig = field(default_factory=AugmentationConfig)
    notes_tokenizer: NotesTokenizerConfig = field(default_factory=NotesTokenizerConfig)


@dataclass
class DataConfig:
    notes_per_record: int = 128  # notes: consecutive notes per training/evaluation record


@dataclass
class ModelConfig:
    name: str = "gpt2-mini"
    arch: str = "gpt2"
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    context_size: int = 256
    dropout: float = 0.0
    bias: bool = True
    vocab_multiple: int = 64
    attention: str = "auto"  # auto | xla | cudnn | blocked
    remat: str = "none"  # none | block | full
    scan_layers: bool = True


@dataclass
class LrConfig:
    name: str = "cosine"  # constant | linear | cosine | trapezoid | piecewise_linear
    lr: float = 1e-3  # peak learning rate
    warmup: int = 0  # steps of linear warmup; the first step's lr is lr / warmup, never 0
    min_lr: float = 0.0  # floor reached at the end of the decay
    max_steps: Optional[int] = None  # schedule length; null = train.max_steps
    decay_fraction: float = 0.2  # trapezoid: share of the steps spent in the final linear decay
    boundaries: list[int] = field(default_factory=list)  # piecewise_linear: steps after warmup ...
    boundary_lrs: list[float] = field(default_factory=list)  # ... and the lr reached at each of them


@dataclass
class OptimizerConfig:
    name: str = "adamw"  # adamw | adam | sgdm | nadam | rmsprop | lion | muon
    lr_config: LrConfig = field(default_factory=LrConfig)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1  # decoupled; matrices only (adamw, lion, muon, sgdm)
    momentum: float = 0.9  # sgdm, rmsprop, muon
    nesterov: bool = False  # sgdm, muon
    decay: float = 0.9  # rmsprop: squared-gradient averaging
    adam_lr_ratio: float = 1.0  # muon: lr of the AdamW part relative to the Muon part
    grad_clip: float = 1.0  # global-norm clipping threshold; 0 = off


@dataclass
class TrainConfig:
    seed: int = 0
    batch_size: int = 16  # sequences per micro-batch per process, split over the process's devices
    grad_accum_steps: int = 1  # micro-batches per optimizer step (optax.MultiSteps)
    max_steps: int = 1000  # optimizer steps
    max_training_hours: Optional[float] = None  # stop (and checkpoint) after this much wall time
    eval_interval: int = 100  # steps between evaluations (and one at the end)
    eval_iters: int = 20  # batches per validation split per evaluation
    log_interval: int = 10  # steps between log lines
    skip_nonfinite: bool = False  # true: skip updates whose gradient is NaN/Inf; false: stop the run there
    eval_at_start: bool = False  # also evaluate before the first step (e.g. the weights init_from brought)


@dataclass
class LoggingConfig:
    run_dir: Optional[str] = None  # null = runs/<name>-<timestamp>
    name: Optional[str] = None  # null = <model.name>-<dataset.name>
    wandb: str = "offline"  # online | offline | disabled
    wandb_project: str = "gpt-jax"
    wandb_entity: Optional[str] = None
    tensorboard: bool = True
    progress: str = "auto"  # auto (a bar on a terminal, lines otherwise) | bar | lines
    # Training statistics (training/stats.py says what each computes and what it costs); all off by default.
    log_callback_data: bool = False  # gradient / parameter / update norms (global, per layer), <g_t, update_t>
    store_last_grads: bool = False  # keep g_{t-1}: cos(g_t, g_{t-1})
    store_past_grads: bool = False  # keep the sum of past gradients: cos(g_t, their mean)
    store_last_params: bool = False  # keep x_{t-1}: the last step's length
    compute_last_loss: bool = False  # f(x_t) - f(x_{t-1}) on the same batch (needs store_last_params)
    compute_last_grads: bool = False  # |g_t - grad f(x_{t-1})| on the same batch (needs store_last_params)
    running_stats_window: int = 0  # > 0: also each statistic's mean over this many steps


@dataclass
class CheckpointConfig:
    save: bool = True
    save_path: Optional[str] = None  # null = <run_dir>/checkpoints
    save_steps: Any = None  # int = every N steps, list = at these steps, null = only latest/best/final
    max_to_keep: Optional[int] = 3  # periodic checkpoints kept besides latest and best; null = all
    load: bool = False
    load_path: Optional[str] = None
    load_file: str = "latest"  # latest | best | <step>
    overwrite_config: bool = False
    overwrite_optimizer: bool = False


@dataclass
class SystemConfig:
    dtype: str = "float32"  # compute dtype: float32 | bfloat16 | float16
    sharding: str = "dp"  # dp (replicated params) | fsdp (sharded params and optimizer state)
    num_devices: Optional[int] = None  # local devices to use (single process); null = all
    mesh_model: int = 1  # size of the mesh's `model` axis (tensor parallelism); the `data` axis takes the rest
    peak_flops: Optional[float] = None  # per-device peak FLOP/s for MFU; null = from the table of known devices
    # Multi-process (multi-host) runs; null = from the launcher's environment (SLURM, Open MPI, JAX_* variables).
    num_processes: Optional[int] = None
    process_id: Optional[int] = None
    coordinator_address: Optional[str] = None  # host:port of process 0
    cpu_devices_per_process: Optional[int] = None  # CPU only: devices each process simulates
    distributed_timeout_s: int = 300  # how long to wait for every process to join
    compilation_cache_dir: Optional[str] = ".cache/jax"  # persistent XLA compilation cache; null = off


@dataclass
class Config:
    mode: str = "train"  # train | eval (evaluate a checkpoint on every validation split and the test split)
    eval_only: bool = False  # the earlier pipeline's name for mode=eval
    stage: str = "next_token_pretraining"  # next_token_pretraining | piano_task
    # scratch_next_token (or null): fresh weights; a checkpoint (or run) dir: its weights, fresh optimizer, step 0;
    # hf:<folder or Hub id>: GPT-2 weights from a transformers folder (e.g. hf:gpt2)
    init_from: Optional[str] = None
    loss_masking: str = "pretraining"  # pretraining: every token but padding | finetuning: only after <GENAI>
    tasks: list[str] = field(default_factory=list)  # piano_task: dynamics | continuation | lower_voices
    task_weights: list[float] = field(default_factory=list)  # how often each task is drawn; empty = equally
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    system: SystemConfig = field(default_factory=SystemConfig)


ConfigStore.instance().store(name="base_config", node=Config)

CHOICES = {
    "mode": ("train", "eval"),
    "stage": ("next_token_pretraining", "piano_task"),
    "loss_masking": ("pretraining", "finetuning"),
    "dataset.source": ("pystdlib", "text_files", "json_files", "hf", "music21", "maestro", "midi_files"),
    "dataset.tokenizer": ("byte", "bpe", "gpt2", "notes"),
    "model.arch": ("gpt2",),
    "model.attention": ("auto", "xla", "cudnn", "blocked"),
    "model.remat": ("none", "block", "full"),
    "optimizer.name": ("adamw", "adam", "sgdm", "nadam", "rmsprop", "lion", "muon"),
    "optimizer.lr_config.name": ("constant", "linear", "cosine", "trapezoid", "piecewise_linear"),
    "logging.wandb": ("online", "offline", "disabled"),
    "logging.progress": ("auto", "bar", "lines"),
    "system.dtype": ("float32", "bfloat16", "float16"),
    "system.sharding": ("dp", "fsdp"),
}


def load_config(overrides: list[str]) -> DictConfig:
    """Compose conf/config.yaml with command-line overrides; raise ConfigError naming the offending key."""
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(config_name="config", overrides=list(overrides))
        validate_keys(cfg)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_one_line(e)) from None
    OmegaConf.set_readonly(cfg, True)
    return cfg


def validate_keys(cfg: DictConfig) -> None:
    _reject_unknown_keys(cfg, Config, "")


def _reject_unknown_keys(node: DictConfig, schema: type, prefix: str) -> None:
    """`+key=value` overrides may append keys the schema does not have; nothing would read them, so refuse."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node.keys():
        if key not in fields:
            raise ConfigError(f"config: unknown key '{prefix}{key}' (python train_jax.py --cfg lists every key)")
        sub_type = fields[key].type
        sub_schema = globals().get(sub_type) if isinstance(sub_type, str) else sub_type
        if dataclasses.is_dataclass(sub_schema) and isinstance(node[key], DictConfig):
            _reject_unknown_keys(node[key], sub_schema, f"{prefix}{key}.")


def _one_line(e: BaseException) -> str:
    """Hydra and OmegaConf errors span many lines; keep the key and the reason."""
    cause = e
    while cause.__cause__ is not None and isinstance(cause.__cause__, (HydraException, OmegaConfBaseException)):
        cause = cause.__cause__
    full_key = getattr(cause, "full_key", None)
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    if isinstance(e, HydraException) and "Could not override" in str(e):
        key = re.search(r"Could not override '([^']+)'", str(e))
        if key and ("not in" in str(cause) or "is not in struct" in str(cause)):
            return f"config: unknown key '{key.group(1)}' (python train_jax.py --cfg lists every key)"
    missing = re.search(r"Could not find '([\w/]+)/([^']+)'", str(e))
    if missing:
        group, choice = missing.groups()
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        return f"config: {group}={choice} does not exist; choose one of {', '.join(options)}"
    return f"config: {full_key}: {text}" if full_key else f"config: {text}"


def validate(cfg: DictConfig, num_local_devices: int) -> None:
    """Check values that types cannot: ranges, divisibility, and choices. Raises ConfigError naming the key."""
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            _fail(key, f"must be one of {', '.join(allowed)}; got {value!r}")

    d, m, o, t = cfg.dataset, cfg.model, cfg.optimizer, cfg.train
    lr = o.lr_config
    _require_positive(cfg, "model.n_layer", "model.n_head", "model.n_embd", "model.context_size",
                      "model.vocab_multiple", "train.batch_size", "train.max_steps", "train.eval_interval",
                      "train.eval_iters", "train.log_interval", "dataset.num_proc")
    if m.n_embd % m.n_head:
        _fail("model.n_embd", f"{m.n_embd} is not divisible by model.n_head={m.n_head}")
    if not 0.0 <= m.dropout < 1.0:
        _fail("model.dropout", f"must be in [0, 1); got {m.dropout}")
    if d.context_size is not None and not 0 < d.context_size <= m.context_size:
        _fail("dataset.context_size", f"{d.context_size} must be in [1, model.context_size={m.context_size}]")
    if t.grad_accum_steps < 1:
        _fail("train.grad_accum_steps", f"must be >= 1; got {t.grad_accum_steps}")
    if t.max_training_hours is not None and t.max_training_hours <= 0:
        _fail("train.max_training_hours", f"must be > 0 (or null for no limit); got {t.max_training_hours}")
    sy = cfg.system
    if sy.num_devices is not None and not 0 < sy.num_devices <= num_local_devices:
        _fail("system.num_devices", f"{sy.num_devices} must be in [1, {num_local_devices}] on this machine")
    if sy.num_devices is not None and (sy.num_processes or 1) > 1:
        _fail("system.num_devices", "selects local devices of a single process; leave it null with num_processes > 1")
    n_dev = sy.num_devices or num_local_devices
    if sy.mesh_model < 1 or n_dev % sy.mesh_model:
        _fail("system.mesh_model", f"{sy.mesh_model} must be >= 1 and divide the {n_dev} local devices")
    data_devices = n_dev // sy.mesh_model
    if t.batch_size % data_devices:
        _fail("train.batch_size", f"{t.batch_size} is not divisible by the {data_devices} local devices it is split "
                                  "over (train.batch_size counts sequences per process)")
    if sy.num_processes is not None and sy.num_processes > 1:
        if sy.process_id is not None and not 0 <= sy.process_id < sy.num_processes:
            _fail("system.process_id", f"must be in [0, {sy.num_processes}); got {sy.process_id}")

    if lr.lr < 0:
        _fail("optimizer.lr_config.lr", f"must be >= 0; got {lr.lr}")
    if lr.name in ("linear", "cosine", "trapezoid") and not 0 <= lr.min_lr <= lr.lr:
        _fail("optimizer.lr_config.min_lr", f"must be in [0, lr={lr.lr}] for a decaying schedule; got {lr.min_lr}")
    if lr.warmup < 0:
        _fail("optimizer.lr_config.warmup", f"must be >= 0; got {lr.warmup}")
    schedule_steps = lr.max_steps if lr.max_steps is not None else t.max_steps
    if lr.max_steps is not None and lr.max_steps < 1:
        _fail("optimizer.lr_config.max_steps", f"must be >= 1 (or null for train.max_steps); got {lr.max_steps}")
    if lr.warmup > schedule_steps:
        _fail("optimizer.lr_config.warmup", f"{lr.warmup} exceeds the schedule's {schedule_steps} steps")
    if not 0.0 <= lr.decay_fraction <= 1.0:
        _fail("optimizer.lr_config.decay_fraction", f"must be in [0, 1]; got {lr.decay_fraction}")
    if lr.name == "piecewise_linear":
        if not lr.boundaries or len(lr.boundaries) != len(lr.boundary_lrs):
            _fail("optimizer.lr_config.boundaries", "piecewise_linear needs boundaries and boundary_lrs of equal, non-zero length")
        if list(lr.boundaries) != sorted(set(lr.boundaries)) or lr.boundaries[0] <= 0:
            _fail("optimizer.lr_config.boundaries", f"must be strictly increasing positive steps; got {list(lr.boundaries)}")
        if any(v < 0 for v in lr.boundary_lrs):
            _fail("optimizer.lr_config.boundary_lrs", f"must all be >= 0; got {list(lr.boundary_lrs)}")
    for key in ("beta1", "beta2", "momentum", "decay"):
        if not 0.0 <= o[key] < 1.0:
            _fail(f"optimizer.{key}", f"must be in [0, 1); got {o[key]}")
    for key in ("eps", "weight_decay", "grad_clip", "adam_lr_ratio"):
        if o[key] < 0:
            _fail(f"optimizer.{key}", f"must be >= 0; got {o[key]}")

    for key in ("val_fraction", "test_fraction"):
        if not 0.0 <= d[key] < 0.5:
            _fail(f"dataset.{key}", f"must be in [0, 0.5); got {d[key]}")
    if d.tokenizer == "bpe" and d.bpe_vocab_size < 260:
        _fail("dataset.bpe_vocab_size", f"must be >= 260 (256 bytes + special tokens); got {d.bpe_vocab_size}")
    if d.source == "text_files" and not d.files:
        _fail("dataset.files", "text_files needs at least one path or glob, e.g. dataset.files=[notes/*.txt]")
    if d.source == "hf" and not d.hf_path:
        _fail("dataset.hf_path", "hf needs a Hub dataset id, e.g. dataset.hf_path=Salesforce/wikitext")
    if d.streaming and d.max_documents is None:
        _fail("dataset.max_documents", "streaming needs a cap on the documents read, e.g. dataset.max_documents=100000")
    if d.max_documents is not None and d.max_documents < 1:
        _fail("dataset.max_documents", f"must be >= 1; got {d.max_documents}")

    _validate_stages(cfg)
    lg = cfg.logging
    for key in ("compute_last_loss", "compute_last_grads"):
        if lg[key] and not lg.store_last_params:
            _fail(f"logging.{key}", "needs the previous parameters: add logging.store_last_params=true")
    if lg.running_stats_window < 0:
        _fail("logging.running_stats_window", f"must be >= 0; got {lg.running_stats_window}")
    if lg.running_stats_window > 0 and not any(lg[k] for k in ("log_callback_data", "store_last_grads",
                                                                "store_past_grads", "store_last_params")):
        _fail("logging.running_stats_window", "averages statistics, but no statistics knob is on (e.g. "
                                              "logging.log_callback_data=true)")

    c = cfg.checkpoint
    steps = c.save_steps
    if steps is not None:
        ok = (isinstance(steps, int) and steps > 0) or (
            OmegaConf.is_list(steps) and all(isinstance(s, int) and s > 0 for s in steps)
        )
        if not ok:
            _fail("checkpoint.save_steps", f"must be a positive int, a list of positive ints, or null; got {steps}")
    if c.max_to_keep is not None and c.max_to_keep < 1:
        _fail("checkpoint.max_to_keep", f"must be >= 1 (or null to keep all); got {c.max_to_keep}")
    if c.load and not c.load_path:
        _fail("checkpoint.load_path", "checkpoint.load=True needs checkpoint.load_path=<checkpoint dir>")
    if evaluating(cfg) and not c.load:
        key = "eval_only" if cfg.eval_only else "mode"
        _fail(key, f"{key}={'true' if cfg.eval_only else 'eval'} evaluates a checkpoint: add checkpoint.load=True "
                   "checkpoint.load_path=<dir>")
    if c.load and (init_from_dir(cfg) or str(cfg.init_from or "").startswith("hf:")):
        _fail("init_from", "choose one: checkpoint.load=True resumes a run, init_from=<dir> starts one from weights")
    if c.load_file not in ("latest", "best") and not str(c.load_file).isdigit():
        _fail("checkpoint.load_file", f"must be latest, best or a step number; got {c.load_file!r}")


def _validate_stages(cfg: DictConfig) -> None:
    """Stage, loss masking, tasks and the notes settings must describe one coherent run."""
    from data.notes_tokenizer import TASK_TOKENS

    d = cfg.dataset
    notes_source = d.source in NOTE_SOURCES
    if notes_source != (d.tokenizer == "notes"):
        _fail("dataset.tokenizer", f"dataset.source={d.source} needs " + (
            "dataset.tokenizer=notes" if notes_source else f"a text tokenizer (byte, bpe, gpt2), not {d.tokenizer}"))
    records = bool(d.prompt_column or d.completion_column)
    if records and not (d.prompt_column and d.completion_column):
        _fail("dataset.prompt_column", "text fine-tuning needs both dataset.prompt_column and dataset.completion_column")
    if records and d.source not in ("json_files", "hf"):
        _fail("dataset.prompt_column", f"prompt/completion records come from dataset.source=json_files or hf, not {d.source}")
    if cfg.stage == "piano_task":
        if not notes_source:
            _fail("stage", f"piano_task needs a notes source (dataset=music21, maestro or midi_files), not {d.source}")
        if not cfg.tasks:
            _fail("tasks", f"stage=piano_task needs at least one task, e.g. tasks=[dynamics]; choose from "
                           f"{', '.join(TASK_TOKENS)}")
    elif cfg.tasks:
        _fail("tasks", "tasks are for stage=piano_task; set stage=piano_task or tasks=[]")
    for task in cfg.tasks:
        if task not in TASK_TOKENS:
            _fail("tasks", f"unknown task {task!r}; choose from {', '.join(TASK_TOKENS)}")
    if cfg.task_weights and (len(cfg.task_weights) != len(cfg.tasks) or min(cfg.task_weights) < 0
                             or sum(cfg.task_weights) <= 0):
        _fail("task_weights", f"needs one weight >= 0 per task ({len(cfg.tasks)}), not all 0; got {list(cfg.task_weights)}")
    if cfg.loss_masking == "finetuning" and cfg.stage != "piano_task" and not records:
        _fail("loss_masking", "finetuning puts the loss after <GENAI>, which only records have: set stage=piano_task "
                              "or dataset.prompt_column / dataset.completion_column")
    if d.source == "maestro" and not d.base_dataset_name:
        _fail("dataset.base_dataset_name", "maestro needs a Hub id or local folder, e.g. epr-labs/maestro-sustain-v2")
    if d.source == "midi_files" and not d.files:
        _fail("dataset.files", "midi_files needs at least one .mid file, folder or glob")
    if d.source == "json_files" and not d.files:
        _fail("dataset.files", "json_files needs at least one .json/.jsonl file or glob")
    _require_positive(cfg, "data.notes_per_record", "dataset.notes_tokenizer.max_shift_steps",
                      "dataset.notes_tokenizer.max_duration_steps", "dataset.notes_tokenizer.velocity_bins")
    if d.max_pieces_per_composer is not None and d.max_pieces_per_composer < 1:
        _fail("dataset.max_pieces_per_composer", f"must be >= 1 (or null for all); got {d.max_pieces_per_composer}")
    if d.notes_tokenizer.time_step <= 0:
        _fail("dataset.notes_tokenizer.time_step", f"must be > 0 seconds; got {d.notes_tokenizer.time_step}")
    if d.notes_tokenizer.velocity_bins > 128:
        _fail("dataset.notes_tokenizer.velocity_bins", f"must be <= 128; got {d.notes_tokenizer.velocity_bins}")
    if not 1 <= d.default_velocity <= 127:
        _fail("dataset.default_velocity", f"must be in [1, 127]; got {d.default_velocity}")
    if d.pause_detection_threshold <= 0:
        _fail("dataset.pause_detection_threshold", f"must be > 0 seconds; got {d.pause_detection_threshold}")
    if not 0 <= d.augmentation.max_pitch_shift <= 127:
        _fail("dataset.augmentation.max_pitch_shift", f"must be in [0, 127]; got {d.augmentation.max_pitch_shift}")
    if any(f <= 0 for f in d.augmentation.speed_change_factors):
        _fail("dataset.augmentation.speed_change_factors", f"must all be > 0; got {list(d.augmentation.speed_change_factors)}")


def evaluating(cfg: DictConfig) -> bool:
    """mode=eval (or eval_only=true): evaluate a checkpoint, train nothing."""
    return cfg.mode == "eval" or bool(cfg.eval_only)


def init_from_dir(cfg: DictConfig) -> str | None:
    """The checkpoint directory `init_from` names, or None for fresh weights (null or scratch_next_token)."""
    if cfg.init_from in (None, "", "scratch_next_token") or str(cfg.init_from).startswith("hf:"):
        return None
    return cfg.init_from


def _require_positive(cfg: DictConfig, *keys: str) -> None:
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if value is None or value < 1:
            _fail(key, f"must be >= 1; got {value}")


def _fail(key: str, reason: str) -> None:
    raise ConfigError(f"config: {key}: {reason}")


def context_size(cfg: DictConfig) -> int:
    """Tokens per training window (the model sees windows of this length)."""
    return cfg.dataset.context_size or cfg.model.context_size


def schedule_steps(cfg: DictConfig) -> int:
    """Length of the learning-rate schedule in optimizer steps."""
    return cfg.optimizer.lr_config.max_steps or cfg.train.max_steps


def listed_save_steps(cfg: DictConfig) -> list[int]:
    """Steps named in a list `checkpoint.save_steps`: always kept, whatever max_to_keep says."""
    steps = cfg.checkpoint.save_steps
    return list(steps) if OmegaConf.is_list(steps) else []


def is_save_step(cfg: DictConfig, step: int) -> bool:
    steps = cfg.checkpoint.save_steps
    if steps is None:
        return False
    return step in steps if OmegaConf.is_list(steps) else step % steps == 0


def flat_hparams(cfg: DictConfig) -> dict[str, Any]:
    """The experiment's knobs as flat `section.key` scalars (TensorBoard's hparams table)."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)

    walk({k: v for k, v in as_dict(cfg).items() if k in ("dataset", "model", "optimizer", "train", "system")}, "")
    return flat


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def as_dict(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]

