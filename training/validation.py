"""The config's one validation pass: values that types cannot check (ranges, divisibility, choices, and settings that
only make sense together). Every failure is a `ConfigError` whose message names the key."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from data.mixture import MIXTURE_BLOCK
from data.batches import allot
from optimizers.registry import check_optimizer
from training.config import NOTE_SOURCES, evaluating, init_from_dir, load_file_step, mixture_sources
from core.errors import ConfigError

CHOICES = {
    "mode": ("train", "eval"),
    "stage": ("next_token_pretraining", "piano_task"),
    "loss_masking": ("pretraining", "finetuning"),
    "dataset.source": ("pystdlib", "text_files", "json_files", "hf", "mixture", "music21", "maestro", "midi_files"),
    "dataset.tokenizer": ("byte", "bpe", "gpt2", "notes"),
    "model.arch": ("gpt2",),
    "model.attention": ("auto", "xla", "cudnn", "blocked"),
    "model.remat": ("none", "block", "full"),
    "optimizer.lr_config.name": ("constant", "linear", "cosine", "trapezoid", "piecewise_linear"),
    "logging.wandb": ("online", "offline", "disabled"),
    "logging.wandb_fallback": ("fail", "offline"),
    "logging.progress": ("auto", "bar", "lines"),
    "system.dtype": ("float32", "bfloat16", "float16"),
    "system.sharding": ("dp", "fsdp"),
}



def _validate_data_path(d: DictConfig, at: str = "dataset") -> None:
    """`at`: where `d` sits in the config (the run's dataset section, or one source of its mixture)."""
    if d.streaming:
        if d.max_documents is None and d.max_tokens is None:
            _fail(f"{at}.max_tokens", "streaming needs a cap, e.g. dataset.max_tokens=10000000000 (or max_documents)")
        if d.tokenizer == "bpe":
            _fail("dataset.tokenizer", "bpe is trained on a whole train split, which a streamed corpus does not have "
                                       "before the build; use gpt2 or byte")
        if d.prompt_column:
            _fail(f"{at}.streaming", "fine-tuning records (prompt_column) are read whole; set dataset.streaming=false")
    for key in ("max_documents", "max_tokens"):
        if d[key] is not None and d[key] < 1:
            _fail(f"{at}.{key}", f"must be >= 1; got {d[key]}")
    if d.document_mask and (d.tokenizer == "notes" or d.prompt_column):
        _fail("dataset.document_mask", "masks documents packed into one window; records (notes, prompt/completion) "
                                       "hold one each already: set it to false")
    if d.docs_per_chunk < 1:
        _fail(f"{at}.docs_per_chunk", f"must be >= 1; got {d.docs_per_chunk}")
    if d.build_timeout_s <= 0:
        _fail(f"{at}.build_timeout_s", f"must be > 0; got {d.build_timeout_s}")
    for key in ("val_fraction", "test_fraction"):
        if not 0.0 <= d[key] < 0.5:
            _fail(f"{at}.{key}", f"must be in [0, 0.5); got {d[key]}")
    if d.source == "text_files" and not d.files:
        _fail(f"{at}.files", "text_files needs at least one path or glob, e.g. dataset.files=[notes/*.txt]")
    if d.source == "hf" and not d.hf_path:
        _fail(f"{at}.hf_path", "hf needs a Hub dataset id, e.g. dataset.hf_path=Salesforce/wikitext")


def _validate_mixture(cfg: DictConfig) -> None:
    """source=mixture: text sources with positive weights and distinct names, each valid on its own."""
    d = cfg.dataset
    if d.source != "mixture":
        if d.mixture:
            _fail("dataset.mixture", f"is read only with dataset.source=mixture (dataset=mixture), not {d.source}")
        return
    if len(d.mixture) < 1:
        _fail("dataset.mixture", "source=mixture needs at least one source, e.g. "
                                 "dataset.mixture=[{dataset: pystdlib, weight: 1}]")
    if d.prompt_column or cfg.loss_masking == "finetuning":
        _fail("dataset.mixture", "mixes pretraining text; fine-tune on one prompt/completion source")
    names, sources = [], mixture_sources(cfg)
    for i, (name, weight, source) in enumerate(sources):
        at = f"dataset.mixture[{i}]"
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            _fail(f"{at}.weight", f"must be a number > 0; got {weight!r}")
        if source.source in NOTE_SOURCES or source.prompt_column:
            _fail(f"{at}.dataset", "a mixture mixes text for next-token pretraining; "
                                   f"{source.source}{' records' if source.prompt_column else ''} cannot be mixed")
        if name in names:
            _fail(f"{at}.name", f"{name!r} names two sources; give each a name of its own")
        names.append(name)
        _validate_data_path(source, at)
    allotted = allot([w for _, w, _ in sources], MIXTURE_BLOCK)
    if min(allotted) == 0:
        _fail("dataset.mixture", f"a weight below 1/{MIXTURE_BLOCK} of the total draws no row; raise it or drop "
                                 "that source")


def validate_values(cfg: DictConfig, num_local_devices: int) -> None:
    """Check values that types cannot: ranges, divisibility, and choices. Raises ConfigError naming the key."""
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            _fail(key, f"must be one of {', '.join(allowed)}; got {value!r}")
    check_optimizer(cfg.optimizer)  # a registered name, and every hyper-parameter its builder needs

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
    if t.z_loss < 0:
        _fail("train.z_loss", f"must be >= 0; got {t.z_loss}")
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
    for key, size in (("model.n_head", m.n_head), ("model.vocab_multiple", m.vocab_multiple)):
        if size % sy.mesh_model:
            _fail("system.mesh_model", f"{sy.mesh_model} must divide {key}={size}: tensor parallelism splits the heads "
                                       "and the vocabulary over the `model` axis")
    data_devices = n_dev // sy.mesh_model
    if t.batch_size % data_devices:
        _fail("train.batch_size", f"{t.batch_size} is not divisible by the {data_devices} local devices it is split "
                                  "over (train.batch_size counts sequences per process)")
    if sy.profile_steps and not (len(sy.profile_steps) == 2 and 1 <= sy.profile_steps[0] <= sy.profile_steps[1]):
        _fail("system.profile_steps", f"must be [first, last] with 1 <= first <= last, or []; got "
                                      f"{list(sy.profile_steps)}")
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

    if d.tokenizer == "bpe" and d.bpe_vocab_size < 260:
        _fail("dataset.bpe_vocab_size", f"must be >= 260 (256 bytes + special tokens); got {d.bpe_vocab_size}")
    _validate_data_path(d)
    _validate_mixture(cfg)

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
    if c.num_steps is not None and c.num_steps < 1:
        _fail("checkpoint.num_steps", f"must be >= 1 (or null for up to train.max_steps); got {c.num_steps}")
    if c.max_to_keep is not None and c.max_to_keep < 1:
        _fail("checkpoint.max_to_keep", f"must be >= 1 (or null to keep all); got {c.max_to_keep}")
    if c.load not in (True, False, "auto"):
        _fail("checkpoint.load", f"must be true, false or auto; got {c.load!r}")
    if c.load is True and not c.load_path:
        _fail("checkpoint.load_path", "checkpoint.load=True needs checkpoint.load_path=<checkpoint dir> (checkpoint.load="
                                      "auto finds this run's own)")
    if evaluating(cfg) and not c.load:
        key = "eval_only" if cfg.eval_only else "mode"
        _fail(key, f"{key}={'true' if cfg.eval_only else 'eval'} evaluates a checkpoint: add checkpoint.load=True "
                   "checkpoint.load_path=<dir>")
    if c.load is True and (init_from_dir(cfg) or str(cfg.init_from or "").startswith("hf:")):
        _fail("init_from", "choose one: checkpoint.load=True resumes a run, init_from=<dir> starts one from weights")
    if c.load_file not in ("latest", "best") and load_file_step(c.load_file) is None:
        _fail("checkpoint.load_file", f"must be latest, best, a step number or iter_<step>.ckpt; got {c.load_file!r}")


def _validate_stages(cfg: DictConfig) -> None:
    """Stage, loss masking, tasks and the notes settings must describe one coherent run."""
    from data.task_names import TASK_NAMES as TASK_TOKENS

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


def _require_positive(cfg: DictConfig, *keys: str) -> None:
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if value is None or value < 1:
            _fail(key, f"must be >= 1; got {value}")


def _fail(key: str, reason: str) -> None:
    raise ConfigError(f"config: {key}: {reason}")
