"""The run configuration: typed schema (Hydra structured configs), composition from conf/, one validation pass.

Values live in conf/*.yaml; types and defaults live here. Hydra composes the YAML with its override grammar
(`model=gpt2 optimizer/lr_config=cosine train.batch_size=8`) onto the schema (unknown keys and wrong types fail
there): train_jax.py is a Hydra application, and `load_config(overrides)` does the same through Hydra's compose API
for scripts and tests. Either way `finish` turns the composed config into the run's, then `validate`
(training/validation.py) checks values. Every failure is a `ConfigError` whose message names the key. The config is
never mutated afterwards; derived values (global batch, decay steps) are computed where used.
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

from core.errors import ConfigError
from optimizers.registry import with_hyper_parameters

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
    source: str = "pystdlib"  # pystdlib | text_files | json_files | hf | mixture (text); music21 | maestro | midi_files
    # source=mixture: the sources and their weights, each a preset of conf/dataset/ with any of its keys changed:
    # [{dataset: fineweb_edu, weight: 0.7}, {dataset: text_files, weight: 0.3, name: mine, files: [notes/]}]
    mixture: list[Any] = field(default_factory=list)
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
    streaming: bool = False  # hf: tokenise while streaming into the token store (needs max_documents or max_tokens)
    max_documents: Optional[int] = None  # cap on documents per split (streamed corpora: documents read in all)
    max_tokens: Optional[int] = None  # streamed corpora: stop reading after the chunk that reaches this many tokens
    docs_per_chunk: int = 4096  # token store: documents per unit of the build (what a killed build redoes at most)
    document_mask: bool = False  # packed text: attention stays within a document, positions restart at each one
    build_timeout_s: float = 21600.0  # multi-process: how long a process waits for the others' part of the build
    num_proc: int = 2  # processes for parsing scores / MIDI files (spawned workers)
    cache_dir: str = ".cache"  # token stores, trained tokenizers, parsed notes (shared by all processes of a run)
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
    name: str = "adamw"  # a registered optimizer (optimizers/): adamw | adam | sgdm | nadam | rmsprop | lion | muon
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


# Each registered optimizer's own hyper-parameters (its builder's keyword arguments that are not fields above) join
# the section, typed by the builder's annotations; null = the builder's default (optimizers/registry.py).
OptimizerConfig = with_hyper_parameters(OptimizerConfig)


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
    z_loss: float = 0.0  # > 0: add z_loss * log(Z)^2 per target token (PaLM's auxiliary loss), logged as z_loss


@dataclass
class LoggingConfig:
    run_dir: Optional[str] = None  # null = runs/<name>-<timestamp>
    name: Optional[str] = None  # null = <model.name>-<dataset.name>
    wandb: str = "offline"  # online | offline | disabled
    # online, when the wandb server cannot be reached or refuses the key (known within 35 s): fail (one line,
    # before training) | offline (a warning, then log offline; `wandb sync` uploads the run later)
    wandb_fallback: str = "fail"
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
    # steps this invocation trains, counted from where it starts (trainit: the steps of one checkpointed run), then it
    # evaluates and checkpoints like a finished run; null = up to train.max_steps, which the schedule still spans
    num_steps: Optional[int] = None
    max_to_keep: Optional[int] = 3  # periodic checkpoints kept besides latest and best; null = all
    # true: resume from load_path; false: start fresh; auto: resume from load_path, or else from this run's save path
    # (save_path, or <logging.run_dir>/checkpoints), when it holds a checkpoint, and start fresh when none does (the
    # same command rerun after a kill continues); a latest checkpoint that does not restore falls back, with a
    # warning, to the newest one that does (true only names it)
    load: Any = False
    load_path: Optional[str] = None
    load_file: str = "latest"  # latest | best | <step> | iter_<step>.ckpt (trainit's name for a step)
    overwrite_config: bool = False
    overwrite_optimizer: bool = False


@dataclass
class SystemConfig:
    dtype: str = "float32"  # compute dtype: float32 | bfloat16 | float16
    sharding: str = "dp"  # dp (replicated params) | fsdp (sharded params and optimizer state)
    num_devices: Optional[int] = None  # local devices to use (single process); null = all
    mesh_model: int = 1  # devices on the mesh's `model` axis (Megatron tensor parallelism); `data` takes the rest
    peak_flops: Optional[float] = None  # per-device peak FLOP/s for MFU; null = from the table of known devices
    # Multi-process (multi-host) runs; null = from the launcher's environment (SLURM, Open MPI, JAX_* variables).
    num_processes: Optional[int] = None
    process_id: Optional[int] = None
    coordinator_address: Optional[str] = None  # host:port of process 0
    cpu_devices_per_process: Optional[int] = None  # CPU only: devices each process simulates
    distributed_timeout_s: int = 300  # how long to wait for every process to join, or for one that falls silent
    compilation_cache_dir: Optional[str] = ".cache/jax"  # persistent XLA compilation cache; null = off
    # true: any device-to-host transfer at a step that does not log, evaluate, save or agree to stop raises
    # (jax.transfer_guard): checks that the loop never makes the device wait for the host between those steps
    transfer_guard: bool = False
    # [a, b]: trace steps a to b (counted from 1, inclusive) with jax.profiler into <run_dir>/profile, for
    # TensorBoard's profile plugin (the .xplane.pb) and Perfetto (perfetto_trace.json.gz); [] = no trace
    profile_steps: list[int] = field(default_factory=list)


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


def load_config(overrides: list[str]) -> DictConfig:
    """Compose conf/config.yaml with command-line overrides (Hydra's compose API, for scripts and tests; train_jax.py
    is composed by Hydra itself) and `finish` it; raise ConfigError naming the offending key."""
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            composed = compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise composition_error(e, overrides) from None
    return finish(composed)


def finish(composed: DictConfig) -> DictConfig:
    """The composed config (Hydra's, without its `hydra` node) as the run's checked, read-only config: the one step
    between composition and use, whether Hydra's app or `load_config` composed it."""
    try:
        validate_keys(composed)
    except OmegaConfBaseException as e:
        raise ConfigError(_one_line(e)) from None
    OmegaConf.set_readonly(composed, True)
    return composed


def composition_error(e: BaseException, overrides: list[str]) -> ConfigError:
    """A failure to compose the config (an override that does not parse, an unknown key or option, a wrong type) as
    one line naming the argument or key."""
    return ConfigError(_unparsable_override(overrides) or _one_line(e))


def _unparsable_override(overrides: list[str]) -> str | None:
    """The first argument Hydra's override grammar rejects, named, with how to write it; None when all parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for item in overrides:
        try:
            parser.parse_override(item)
        except HydraException as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return (f"config: cannot parse the argument {item!r} ({reason}); write a list whole, e.g. "
                    "'train.batch_size=[1,2]', and quote a value with spaces, commas or brackets for Hydra inside the "
                    "shell's quotes: 'key=\"a, b\"'")
    return None


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
    # A value in a YAML of conf/ that the schema refuses: Hydra names the file and chains OmegaConf's error.
    in_file = re.match(r"In '([\w/.-]+)': \w+ raised while composing", str(e))
    if in_file and isinstance(e.__context__, OmegaConfBaseException):
        cause = e.__context__
    full_key = getattr(cause, "full_key", None)
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    if isinstance(e, HydraException) and "Could not override" in str(e):
        key = re.search(r"Could not override '([^']+)'", str(e))
        unknown = key and ("not in" in str(cause) or "is not in struct" in str(cause))
        if unknown and key.group(1).startswith("hydra."):
            inside = full_key and full_key != key.group(1)  # a key in a dictionary's value: `+` adds it
            return (f"config: unknown key '{full_key or key.group(1)}' of Hydra's (python train_jax.py --cfg hydra "
                    "lists them" + (f"; +{key.group(1)}={{...}} adds keys to it)" if inside else ")"))
        if unknown:
            return f"config: unknown key '{key.group(1)}' (python train_jax.py --cfg lists every key)"
    missing = re.search(r"Could not find '([\w/]+)/([^']+)'", str(e))
    if missing and missing.group(1).startswith("hydra/"):  # launchers and sweepers are plugins' as well as files
        return (f"config: {missing.group(1)}={missing.group(2)} does not exist (python train_jax.py --help lists the "
                "options; the launchers and sweepers other than basic come with requirements-sweeps.txt)")
    if missing:
        group, choice = missing.groups()
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        return f"config: {group}={choice} does not exist; choose one of {', '.join(options)}"
    if in_file and full_key:
        hint = (" (an optimizer's hyper-parameters are the keyword arguments of its builder in optimizers/)"
                if full_key.startswith("optimizer.") and "not in" in text else "")
        return f"config: conf/{in_file.group(1)}.yaml: {full_key}: {text}{hint}"
    return f"config: {full_key}: {text}" if full_key else f"config: {text}"


# Keys a mixture's sources take from the run's dataset section unless the entry sets them: where the caches live and
# how the data is cut up are the run's, not a source's. The tokenizer is always the run's (one vocabulary).
MIXTURE_INHERITED = ("bpe_vocab_size", "context_size", "docs_per_chunk", "document_mask", "build_timeout_s",
                     "num_proc", "cache_dir")
MIXTURE_ENTRY_KEYS = ("dataset", "weight")


def mixture_sources(cfg: DictConfig) -> list[tuple[str, float, DictConfig]]:
    """dataset.mixture as (name, weight, that source's complete dataset section): the entry's preset from
    conf/dataset/, then the keys the run's dataset section lends it (MIXTURE_INHERITED), then the entry's own keys."""
    d, sources = cfg.dataset, []
    for i, entry in enumerate(d.mixture):
        where = f"dataset.mixture[{i}]"
        if not isinstance(entry, DictConfig) or any(k not in entry for k in MIXTURE_ENTRY_KEYS):
            raise ConfigError(f"config: {where}: needs `dataset` (a preset of conf/dataset/) and `weight`, e.g. "
                              "{dataset: pystdlib, weight: 0.5}")
        preset = CONF_DIR / "dataset" / f"{entry.dataset}.yaml"
        choices = sorted(p.stem for p in preset.parent.glob("*.yaml") if p.stem != "mixture")
        if entry.dataset == "mixture" or not preset.exists():
            raise ConfigError(f"config: {where}.dataset: {entry.dataset} is not a source; choose one of "
                              f"{', '.join(choices)}")
        if "tokenizer" in entry or "mixture" in entry:
            key = "tokenizer" if "tokenizer" in entry else "mixture"
            raise ConfigError(f"config: {where}.{key}: set by the run (dataset.{key}), not per source")
        own = {k: v for k, v in entry.items() if k not in MIXTURE_ENTRY_KEYS}
        try:
            node = OmegaConf.merge(OmegaConf.structured(DatasetConfig), OmegaConf.load(preset),
                                   {k: d[k] for k in MIXTURE_INHERITED}, {"tokenizer": d.tokenizer}, own)
        except OmegaConfBaseException as e:
            raise ConfigError(_one_line(e).replace("config: ", f"config: {where}.", 1)) from None
        OmegaConf.set_readonly(node, True)
        sources.append((str(node.name), entry.weight, node))
    return sources


def evaluating(cfg: DictConfig) -> bool:
    """mode=eval (or eval_only=true): evaluate a checkpoint, train nothing."""
    return cfg.mode == "eval" or bool(cfg.eval_only)


def load_mode(cfg: DictConfig) -> str:
    """`checkpoint.load` as "true", "false" or "auto" (Hydra reads true and false as booleans)."""
    load = cfg.checkpoint.load
    return load if isinstance(load, str) else "true" if load else "false"


def init_from_dir(cfg: DictConfig) -> str | None:
    """The checkpoint directory `init_from` names, or None for fresh weights (null or scratch_next_token)."""
    if cfg.init_from in (None, "", "scratch_next_token") or str(cfg.init_from).startswith("hf:"):
        return None
    return cfg.init_from


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


def load_file_step(load_file: str) -> int | None:
    """The step `checkpoint.load_file` names: a step number, or trainit's file name for it, iter_<step>.ckpt (the
    step's directory here); None for anything else."""
    named = re.fullmatch(r"(\d+)|iter_(\d+)\.ckpt", str(load_file))
    return None if named is None else int(named.group(1) or named.group(2))


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



def validate(cfg: DictConfig, num_local_devices: int) -> None:
    """Check values that types cannot; raises ConfigError naming the key (the checks: training/validation.py)."""
    from training.validation import validate_values

    validate_values(cfg, num_local_devices)
