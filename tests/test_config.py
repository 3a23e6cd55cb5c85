"""Config is checked at the door: each bad value exits 2 with one line naming the key, before anything runs."""

import dataclasses
import shutil

import pytest
import yaml
from omegaconf import OmegaConf

import train_jax
from core.errors import ConfigError
from helpers import ROOT, run_cli, run_in_process, tiny_overrides
from training.config import (
    Config,
    Dtype,
    LoadMode,
    as_dict,
    compose_config,
    evaluating,
    finish,
    init_from_dir,
    load_config,
    to_config,
    to_yaml,
)
from training.config.help import help_text

BAD_CONFIGS = [
    (["train.foo=1"], "unknown key 'train.foo'"),
    (["+nonsense=1"], "unknown key 'nonsense'"),
    (["train.batch_size=abc"], "train.batch_size"),
    (["optimizer.lr_config.lr=-0.1"], "optimizer.lr_config.lr: must be >= 0"),
    (["model.n_head=5"], "model.n_embd: 64 is not divisible by model.n_head=5"),
    (["dataset.context_size=128"], "dataset.context_size: 128 must be in [1, model.context_size=64]"),
    (
        ["system.num_devices=null", "train.batch_size=12"],
        "train.batch_size: 12 is not divisible by the 8 local devices",
    ),
    (["train.grad_accum_steps=0"], "train.grad_accum_steps: must be >= 1"),
    (["train.seed=-1"], "train.seed: must be >= 0; got -1"),  # numpy's data order took it, then failed mid-run
    # every process was lost at once: a peer that has not yet beaten is stale after 0 s
    (["system.distributed_timeout_s=0"], "system.distributed_timeout_s: must be >= 10 s"),
    # a count below 1 trained one process without a word; a rank out of range was refused only at the join, as if
    # system.num_processes were missing
    (["system.num_processes=0"], "system.num_processes: must be >= 1, or null for a launcher's count; got 0"),
    (["system.process_id=-1"], "system.process_id: must be >= 0; got -1"),
    (["system.num_processes=1", "system.process_id=1"], "system.process_id: must be in [0, 1); got 1"),
    # keys a source leaves unread were dropped without a word: a cap on a loaded dataset, the held-out fractions of
    # a source with splits of its own, a bpe size under another tokenizer
    (["dataset=hf", "dataset.hf_path=x", "dataset.max_tokens=9"], "dataset.max_tokens: caps a streamed build; set"),
    (["dataset=wikitext2", "dataset.val_fraction=0.1"], "dataset.val_fraction: the source's 'validation' split"),
    (
        ["dataset=hf", "dataset.hf_path=x", "dataset.val_split=null", "dataset.test_fraction=0.1"],
        "dataset.test_fraction: is held out of train only when dataset.val_split and dataset.test_split are both null "
        "(they are null and test)",
    ),
    (["dataset.tokenizer=byte", "dataset.bpe_vocab_size=300"], "dataset.bpe_vocab_size: sizes the bpe tokenizer, and"),
    (["system.dtype=fp8", "model.fused_qkv=false"], "model.fused_qkv: false splits the QKV product in three, and FP8"),
    (["data.notes_per_record=64"], "data.notes_per_record: cuts pieces of notes into records, and dataset=pystdlib is"),
    (  # a stream reads its train split only: the Hub's validation split was ignored without a word
        ["dataset=hf", "dataset.hf_path=x", "dataset.streaming=true", "dataset.tokenizer=byte", "dataset.max_tokens=9"],
        "dataset.val_split: a stream reads only dataset.train_split",
    ),
    (["model=gpt3"], "model=gpt3 does not exist; choose one of gpt2, gpt2-large"),
    (["optimizer=adamw", "optimizer/lr_config=exponential"], "optimizer/lr_config=exponential does not exist"),
    (["optimizer.name=adagrad"], "optimizer.name: must be one of adafactor, adam, "),
    (["train.max_training_hours=-1"], "train.max_training_hours: must be > 0"),
    (["checkpoint.save_steps=[10,-5]"], "checkpoint.save_steps"),
    (["checkpoint.save_steps=true"], "checkpoint.save_steps: must be a positive int"),  # not the int 1: every step
    (["checkpoint.load=True"], "checkpoint.load_path"),
    (["checkpoint.num_steps=0"], "checkpoint.num_steps: must be >= 1 (or null for up to train.max_steps); got 0"),
    (
        ["checkpoint.load_file=iter_x.ckpt"],
        "checkpoint.load_file: must be latest, best, a step number or iter_<step>.ckpt; got 'iter_x.ckpt'",
    ),
    (["system.dtype=fp4"], "system.dtype: 'fp4' is not one of float32, bfloat16, float16, fp8"),
    (["system.fp8_margin=-1"], "system.fp8_margin: must be 0 to 8 (powers of two of headroom); got -1"),
    (["model.remat=True"], "model.remat: 'True' is not one of none, block, full"),
    (["checkpoint.load=maybe"], "checkpoint.load: must be true, false or auto; got 'maybe'"),
    (
        ["optimizer.lr_config.min_lr=2e-4"],
        "unknown key 'optimizer.lr_config.min_lr' (python train_jax.py --cfg lists "
        "every key); it is now optimizer.lr_config.min_lr_ratio",
    ),
    (["optimizer.lr_config.warmup=2.5"], "optimizer.lr_config.warmup: 1 or more is a number of steps, a whole one"),
    (["optimizer.lr_config.min_lr_ratio=2"], "optimizer.lr_config.min_lr_ratio: must be in [0, 1]"),
    (["model.attention_window=0"], "model.attention_window: must be >= 1 (the query itself), or null; got 0"),
    (
        ["dataset.document_starts=true", "dataset.max_document_tokens=1"],
        "dataset.max_document_tokens: must be >= 2 (a BOS and a token); got 1",
    ),
    (["optimizer=muon", "optimizer.momentum_cooldown=20"], "optimizer.momentum_cooldown: 20 steps exceed the run's 8"),
    (
        ["optimizer=muon", "optimizer.momentum_cooldown=2", "optimizer.momentum_end=1.0"],
        "optimizer.momentum_cooldown, momentum_end: the cool-down must be >= 0 steps and its end in [0, 1)",
    ),
    (
        [
            "dataset=json_files",
            "dataset.prompt_column=a",
            "dataset.completion_column=b",
            "dataset.document_starts=true",
        ],
        "dataset.document_starts: aligns packed documents to the start of each row; records",
    ),
    # keys the rest of the config leaves unread were accepted and ignored: refused, naming what reads them
    (["model.rope_theta=500"], "model.rope_theta: read only by rotary positions (model.position=learned): set"),
    (["model.rope_frequencies=half_truncated"], "model.rope_frequencies: read only by rotary positions"),
    (["model.qk_norm_weight=false"], "model.qk_norm_weight: read only by QK-norm (model.qk_norm=false)"),
    (["model.logit_softcap_form=algebraic"], "model.logit_softcap_form: read only by the soft-cap (logit_softcap=0"),
    (["model.head_loss=dense", "model.head_loss_chunk=64"], "model.head_loss_chunk: read only by the chunked head"),
    (["optimizer.lr_config.boundaries=[4]"], "lr_config.boundaries: read only by piecewise_linear (the cosine"),
    (["optimizer.lr_config.decay_fraction=0.5"], "lr_config.decay_fraction: read only by trapezoid (the cosine sch"),
    (["checkpoint.load_path=runs/x"], "checkpoint.load_path: read only by a resume (checkpoint.load=false): set"),
    (["checkpoint.overwrite_optimizer=true"], "checkpoint.overwrite_optimizer: read only by a resume"),
    (  # the schedule, its warm-up too, never reaches a method that sets its own step size
        ["optimizer=schedule_free_adamw", "optimizer.lr_config.warmup=2"],
        "optimizer.lr_config.warmup: schedule_free_adamw sets its own step size (optimizer.sf_lr)",
    ),
    (
        ["optimizer=cocob", "optimizer.lr_config.warmup=0", "train.stages=[{until:0.5,lr_multiplier:2.0},{until:1.0}]"],
        "train.stages[0].lr_multiplier: cocob sets its own step size",
    ),
    (["optimizer=scion", "optimizer.weight_decay=0.1"], "optimizer.weight_decay: scion has no decay of its own"),
    (  # the last stage's window replaced it without a word
        ["model.attention_window=16", "train.stages=[{until:0.5,attention_window:8},{until:1.0,attention_window:32}]"],
        "model.attention_window: train.stages name the windows, and the last stage's (32) is the model's",
    ),
    # a key inside a list's value was named as the list (`unknown key 'train.stages'`), or without it (`until: ...`)
    (
        ["train.stages=[{until: 1.0, bacth_size: 4}]"],
        "train.stages: unknown key 'bacth_size' in its value; its keys: until, batch_size,",
    ),
    (["train.stages=[{until: half}]"], "train.stages: until: Value 'half' of type 'str' could not be converted"),
    (  # the preset's points at 400 and 800 in an 8-step run: never reached, unsaid
        ["optimizer/lr_config=piecewise_linear"],
        "optimizer.lr_config.boundaries: the last point, at step 802 (its boundary after the warmup), is past the",
    ),
    (["dataset.val_fraction=0"], "dataset.val_fraction: 0 holds out no validation documents"),  # exit 1, loaded
    (["system.peak_flops=-1"], "system.peak_flops: must be > 0"),  # an MFU of -1.6e12 %
    (["system.cpu_devices_per_process=0"], "system.cpu_devices_per_process: must be >= 1"),  # ignored, unsaid
    (["dataset.cache_dir="], "dataset.cache_dir: must name a directory"),  # caches in the working directory
    # NaN passed every range check (each comparison false): a NaN loss after the data loaded, or clipping (a time
    # limit) silently off; inf the same, and a traceback for a warmup
    (["optimizer.lr_config.lr=nan"], "optimizer.lr_config.lr: must be a number; got nan"),
    (["optimizer.grad_clip=nan"], "optimizer.grad_clip: must be a number; got nan"),
    (["optimizer.lr_config.warmup=inf"], "optimizer.lr_config.warmup: must be finite; got inf"),
    (["optimizer.eps=0"], "optimizer.eps: must be > 0; got 0"),  # 0/0 on a parameter with no gradient: NaN
    (["train.seed=4294967301"], "train.seed: must be below 2**32"),  # the same model as seed 5
    (["optimizer=prodigy", "optimizer.growth_rate=0"], "optimizer.growth_rate: prodigy needs it >= 1; got 0"),
    # values only the optimizer's builder checks: refused after the corpus had loaded and tokenised
    (["optimizer=muon", "optimizer.groups.matrix.ns_steps=0"], "optimizer.groups.matrix.ns_steps: must be >= 1"),
    (["optimizer=muon", "optimizer.ns_steps=0"], "optimizer.ns_steps: must be >= 1"),
    # conf/config.yaml shows `recipe: null` for none: Hydra said `Config group override must be a string or a list`
    (["recipe=null"], "recipe=null: a group takes one of its options (speedrun, speedrun-micro); leave it out"),
    # a group chosen with a dot sets the key: OmegaConf said `Invalid type assigned: str is not a subclass of LrConfig`
    (
        ["optimizer.lr_config=cosine"],
        "optimizer.lr_config is a config group, chosen with a slash: optimizer/lr_config=cosine (its options: "
        "constant, cosine, linear, piecewise_linear, trapezoid)",
    ),
    # a misspelt key: the nearest of its section, or the sections with a key of its name
    (
        ["train.max_step=5"],
        "unknown key 'train.max_step' (python train_jax.py --cfg lists every key); did you mean train.max_steps?",
    ),
    (
        ["+model.n_layers=1"],
        "unknown key 'model.n_layers' (python train_jax.py --cfg lists every key); did you mean model.n_layer?",
    ),
    (["train.context_size=32"], "did you mean dataset.context_size or model.context_size?"),
    # an optimizer's own warm-ups were taken unchecked: sf_warmup=100 in an 8-step run kept the step size under 8%
    (
        ["optimizer=schedule_free_adamw", "optimizer.lr_config.warmup=0", "optimizer.sf_warmup=100"],
        "optimizer.sf_warmup: 100 steps exceed the run's 8 (train.max_steps), which never ends the warm-up",
    ),
    (["optimizer=muon", "optimizer.momentum_warmup=2.5"], "optimizer.momentum_warmup: 1 or more is a number of steps"),
    (["optimizer=muon", "optimizer.momentum_warmup=-1"], "optimizer.momentum_warmup: must be >= 0"),
    (["optimizer=ademamix", "optimizer.beta3_warmup=9"], "optimizer.beta3_warmup: 9 steps exceed the run's 8"),
    (
        ["optimizer=muon", "optimizer.groups={matrix: {name: muon, momentum_warmup: 1000}}"],
        "optimizer.groups.matrix.momentum_warmup: 1000 steps exceed the run's 8",
    ),
]


@pytest.mark.parametrize("overrides,message", BAD_CONFIGS, ids=[o[0][-1] for o in BAD_CONFIGS])
def test_bad_config_exits_2_with_one_line_naming_the_key(overrides, message, tmp_path, capsys):
    """Refused at the door: before any data is read (an empty data cache, which a later check would first fill,
    saying so on stderr) and before anything is written."""
    run_dir = tmp_path / "run"
    code = train_jax.command_line(tiny_overrides(str(tmp_path / "data"), f"logging.run_dir={run_dir}", *overrides))
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: config: ") and message in err, err
    assert not run_dir.exists(), "nothing is written for a bad config"
    loaded = [p.name for p in (tmp_path / "data").glob("*") if p.name != "jax"]  # jax: a run's compile cache
    assert not loaded, f"the corpus was read for a bad config: {loaded}"


def test_an_optimizers_own_warmup_below_1_is_a_fraction_of_the_run_for_every_method():
    """As lr_config.warmup (optimizers/schedules.py own_warmups_in_steps); AdEMAMix's two were typed int, and 0.5
    was refused as `could not be converted to Integer`."""
    from optimizers import own_warmups_in_steps

    cfg = load_config(["optimizer=ademamix", "optimizer.alpha_warmup=0.5", "optimizer.beta3_warmup=0.25"])
    steps = own_warmups_in_steps(cfg.optimizer, 20)
    assert (steps.alpha_warmup, steps.beta3_warmup) == (10, 5)


def test_a_group_set_to_null_is_a_config_error_from_load_config_and_a_sweep_too(tmp_path, capsys):
    """load_config raised Hydra's ValueError, not the one-line ConfigError its callers catch; a sweep said
    `sweep: ValueError: Config group override must be a string or a list`."""
    with pytest.raises(ConfigError, match=r"^config: optimizer=null: a group takes one of its options \(adafactor, "):
        load_config(["optimizer=null"])
    assert train_jax.command_line(["-m", "recipe=null", "train.seed=1,2", f"hydra.sweep.dir={tmp_path / 's'}"]) == 2
    assert capsys.readouterr().err.startswith("error: config: recipe=null: a group takes one of its options")
    assert not (tmp_path / "s").exists()


def test_inf_is_a_value_only_where_it_means_unbounded_and_nan_nowhere():
    assert load_config(["optimizer=prodigy", "optimizer.growth_rate=inf"]).optimizer.growth_rate == float("inf")
    mixture = "[{dataset: pystdlib, weight: 1.0, name: a}, {dataset: pystdlib, weight: inf, name: b}]"
    with pytest.raises(ConfigError, match=r"^config: dataset\.mixture\[1\]\.weight: must be finite; got inf$"):
        load_config(["dataset=mixture", f"dataset.mixture={mixture}"])  # a traceback after the data loaded
    huge = "[{dataset: pystdlib, weight: 1e308, name: a}, {dataset: pystdlib, weight: 1e308, name: b}]"
    with pytest.raises(ConfigError, match=r"^config: dataset\.mixture: the weights' sum inf is not a finite number"):
        load_config(["dataset=mixture", f"dataset.mixture={huge}"])  # an IndexError traceback after the data loaded
    with pytest.raises(ConfigError, match=r"^config: optimizer\.groups\.matrix\.lr_multiplier: must be a number"):
        load_config(["optimizer.groups={matrix: {lr_multiplier: nan}}"])


def test_a_saved_config_with_an_absolute_floor_resumes_with_the_same_floor_as_a_ratio():
    """Checkpoints written before the presets owned their schedules hold optimizer.lr_config.min_lr: resuming reads it
    as the same floor, min_lr / lr (training/config/legacy.py)."""
    from training.config.legacy import upgrade_saved

    saved = compose_config(["optimizer.lr_config.lr=2e-3"])
    node = OmegaConf.create(OmegaConf.to_container(saved))
    del node.optimizer.lr_config["min_lr_ratio"]
    node.optimizer.lr_config["min_lr"] = 5e-4
    upgraded = finish(upgrade_saved(node), 1)
    assert upgraded.optimizer.lr_config.min_lr_ratio == pytest.approx(0.25)


def test_bad_config_from_the_command_line_has_no_traceback(tmp_path):
    result = run_cli(["train.foo=1", f"logging.run_dir={tmp_path}/run"], timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: config: unknown key 'train.foo' (python train_jax.py --cfg lists every key)"
    ]


def test_overrides_and_groups_compose_like_hydra():
    cfg = load_config(
        [
            "model=gpt2",
            "optimizer=sgdm",
            "optimizer/lr_config=linear",
            "optimizer.lr_config.lr=0.5",
            "train.batch_size=4",
        ]
    )
    assert (cfg.model.n_layer, cfg.model.n_embd, cfg.model.context_size) == (12, 768, 1024)
    assert cfg.optimizer.name == "sgdm" and cfg.optimizer.momentum == 0.9
    assert cfg.optimizer.lr_config.name == "linear" and cfg.optimizer.lr_config.lr == 0.5
    assert cfg.train.batch_size == 4


def test_config_is_read_only_once_loaded():
    cfg = load_config([])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.batch_size = 3


def test_the_same_overrides_compose_once_until_a_file_of_conf_changes(tmp_path, monkeypatch):
    from training.config import compose

    monkeypatch.setattr(compose, "CONF_DIR", shutil.copytree(compose.CONF_DIR, tmp_path / "conf"))
    monkeypatch.setattr(compose, "_LOADED", {})
    composed = []
    real = compose.compose_config
    monkeypatch.setattr(compose, "compose_config", lambda overrides: composed.append(overrides) or real(overrides))

    first, second = (compose.load_config(["model=gpt2-tiny", "train.batch_size=8"], 8) for _ in range(2))
    assert first == second and first is not second and first.model.n_layer == 2
    assert len(composed) == 1
    with pytest.raises(ConfigError, match="train.batch_size"):  # the device check runs on every call
        compose.load_config(["model=gpt2-tiny", "train.batch_size=8"], 3)
    preset = tmp_path / "conf" / "model" / "gpt2-tiny.yaml"
    preset.write_text(preset.read_text().replace("n_layer: 2", "n_layer: 3"))
    assert compose.load_config(["model=gpt2-tiny", "train.batch_size=8"], 8).model.n_layer == 3
    assert len(composed) == 2
    for _ in range(2):  # a failure is raised again, not remembered as anything
        with pytest.raises(ConfigError, match="banana"):
            compose.load_config(["train.batch_size=banana"])
    assert len(composed) == 4


ONE_PASS = [
    [],
    ["train.batch_size=8", "model=gpt2-tiny", "train.batch_size=4"],  # the last value of a key wins
    ["optimizer=lion", "optimizer/lr_config=cosine", "optimizer.lr_config.lr=3e-4", "optimizer.lr_config.warmup=5"],
    ["recipe=speedrun-micro", "train.max_steps=7"],
    ["dataset=text_files", "dataset.files=[a.txt,b.txt]", "++train.seed=3", "logging.run_dir='a b'"],
    ["+recipe=speedrun", "~recipe"],
    ["model=gpt2-tiny", "model.n_layer=4", "model={n_layer:3}", "optimizer={weight_decay:0.5}"],
    ["+model.foo=1", "model={foo:2}"],  # (an unknown key: `finish` refuses it)
    ["hydra.job.name=x", "train.seed=2"],
]


@pytest.mark.parametrize("overrides", ONE_PASS)
def test_a_composition_is_hydras_in_one_pass_and_each_choice_of_presets_is_composed_once(overrides):
    """`compose_config` keeps what the presets chosen compose to and sets the other overrides onto a copy, with
    Hydra's code: the config is the one Hydra composes from all the overrides at once, and a second list with the
    same choices and other values composes no preset again."""
    from training.config import compose

    ours, hydras = compose_config(overrides), compose._compose(overrides)
    assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(hydras) and OmegaConf.is_struct(ours)
    if not overrides or overrides[0].startswith("hydra"):
        return
    before = compose._chosen.cache_info()
    compose_config([*overrides, "train.eval_iters=3"])
    after = compose._chosen.cache_info()
    assert (after.hits, after.misses) == (before.hits + 1, before.misses)


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.bogus=1"],
        ["model=nope"],
        ["train.batch_size=abc"],
        ["train.seed=1,2"],
        ["+train.seed=3"],
        ["~train.x"],
        ["~optimizer.lr_config.min_lr_ratio"],
        ["model@x=gpt2"],
    ],
)
def test_a_composition_that_fails_says_what_hydra_says(overrides):
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from training.config import compose

    with pytest.raises(ConfigError) as ours:
        compose_config(overrides)
    with pytest.raises((HydraException, OmegaConfBaseException)) as hydras:
        compose._compose(overrides)
    assert str(ours.value) == str(compose.composition_error(hydras.value, overrides))


def test_a_config_made_after_another_keeps_none_of_its_values():
    """`to_config` merges each config onto a schema node kept for the process (one per dataset class): what one
    config sets, its dataset section's keys included, never reaches the next."""
    first = to_config({"train": {"batch_size": 3}, "dataset": {"source": "text_files", "files": ["notes/"]}})
    assert (first.train.batch_size, first.dataset.files) == (3, ["notes/"])
    assert to_config({}).train.batch_size == Config().train.batch_size == 16
    assert to_config({"dataset": {"source": "text_files"}}).dataset.files == []


def test_cfg_prints_every_key_of_the_composed_config_and_runs_nothing(tmp_path, capsys):
    overrides = ["model=gpt2-tiny", "optimizer=sgdm", "train.max_steps=7", f"logging.run_dir={tmp_path}/run"]
    assert train_jax.command_line(["--cfg", *overrides]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == as_dict(to_config(compose_config(overrides)))
    assert printed["model"]["name"] == "gpt2-tiny" and printed["optimizer"]["momentum"] == 0.9
    assert printed["train"]["max_steps"] == 7 and printed["optimizer"]["lr_config"]["name"] == "cosine"
    assert not (tmp_path / "run").exists()


def test_the_code_receives_typed_sections_whose_choices_still_compare_as_strings():
    cfg = load_config(["system.dtype=bfloat16", "optimizer=lion"])
    assert type(cfg) is Config and dataclasses.is_dataclass(cfg.system) and dataclasses.is_dataclass(cfg.dataset)
    assert cfg.system.dtype is Dtype.bfloat16 and cfg.system.dtype == "bfloat16"
    assert cfg.optimizer.name == "lion" and cfg.optimizer.lr_config.name == "cosine"


@pytest.mark.parametrize(
    "spelling,mode", [("True", "true"), ("true", "true"), ("false", "false"), ("False", "false"), ("auto", "auto")]
)
def test_checkpoint_load_takes_trainits_spellings_and_yamls_booleans(spelling, mode):
    cfg = load_config([f"checkpoint.load={spelling}", *(["checkpoint.load_path=runs/x"] if mode != "false" else [])])
    assert cfg.checkpoint.load is LoadMode(mode)


def test_checkpoint_load_reads_the_booleans_of_earlier_saved_configs():
    for saved, mode in ((True, LoadMode.true), (False, LoadMode.false)):
        assert to_config({"checkpoint": {"load": saved, "load_path": "runs/x"}}).checkpoint.load is mode


def test_a_saved_config_reads_back_as_the_same_typed_config():
    """What a run writes (config.yaml; the checkpoint's JSON metadata) is what a resumed run or a script reads."""
    cfg = load_config(
        [
            "dataset=mixture",
            "dataset.tokenizer=byte",
            "system.dtype=bfloat16",
            "checkpoint.load=auto",
            "checkpoint.save_steps=[5,10]",
            "model.remat=block",
            "logging.wandb=disabled",
        ]
    )
    assert to_config(as_dict(cfg)) == cfg
    assert finish(OmegaConf.create(yaml.safe_load(to_yaml(cfg)))) == cfg
    assert to_config(as_dict(cfg)) != load_config([])


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        [
            "dataset=mixture",
            "dataset.tokenizer=byte",
            "system.dtype=bfloat16",
            "checkpoint.save_steps=[5,10]",
            "model.remat=block",
            "logging.wandb=disabled",
            "system.profile_steps=[3,4]",
        ],
        ["dataset=music21", "stage=piano_task", "tasks=[dynamics]", "init_from=runs/x", "optimizer=muon"],
    ],
)
def test_the_config_as_data_is_omegaconfs_own_conversion(overrides):
    """as_dict / to_yaml walk the dataclasses directly (each checkpoint's metadata carries the config); they give
    what OmegaConf gives for the structured config, enums as names included."""
    cfg = load_config(overrides)
    node = OmegaConf.structured(cfg)
    assert as_dict(cfg) == OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    assert {type(v) for v in leaves(as_dict(cfg))} <= {str, int, float, bool, type(None)}  # no enum, no tuple
    assert to_yaml(cfg) == OmegaConf.to_yaml(node, resolve=True)


def leaves(data):
    if isinstance(data, dict):
        return [leaf for v in data.values() for leaf in leaves(v)]
    if isinstance(data, list):
        return [leaf for v in data for leaf in leaves(v)]
    return [data]


def test_the_checks_that_need_the_device_count_wait_for_it():
    composed = compose_config(["system.num_devices=null", "train.batch_size=12"])
    assert finish(composed).train.batch_size == 12  # before JAX knows its devices: not checked yet
    with pytest.raises(ConfigError, match="train.batch_size: 12 is not divisible by the 8 local devices"):
        finish(composed, num_local_devices=8)


@pytest.mark.parametrize("init_from", ["hf:hf-out", "runs/x"])
def test_mode_eval_of_init_froms_weights_names_what_scores_them(init_from):
    """mode=eval with init_from asked for checkpoint.load=True, which init_from then refused (`choose one`)."""
    with pytest.raises(
        ConfigError,
        match=r"^config: mode: mode=eval evaluates a run's checkpoint \(checkpoint.load=True "
        r"checkpoint.load_path=<dir>\), not init_from's weights: a run with init_from and train.eval_at_start=true "
        r"scores those at its step 0$",
    ):
        load_config(["mode=eval", f"init_from={init_from}"])


def test_the_earlier_pipelines_names_mean_what_they_meant_there(capsys, monkeypatch):
    """piano-gpt's eval_only=true and init_from=scratch_next_token and trainit's iter_<step>.ckpt read as today's
    values at the door (training/config/legacy.py): the typed config holds only today's, and each is said once."""
    from training.config import legacy

    monkeypatch.setattr(legacy, "_said", set())
    cfg = load_config(["eval_only=true", "checkpoint.load=True", "checkpoint.load_path=runs/x"])
    assert evaluating(cfg) and cfg.mode == "eval" and cfg.eval_only is False
    with pytest.raises(ConfigError, match="^config: mode: mode=eval evaluates a checkpoint"):
        load_config(["eval_only=true"])
    cfg = load_config(["init_from=scratch_next_token", "checkpoint.load_file=iter_100.ckpt"])
    assert cfg.init_from is None and init_from_dir(cfg) is None and cfg.checkpoint.load_file == "100"
    assert init_from_dir(load_config(["init_from=runs/x"])) == "runs/x"
    assert capsys.readouterr().err.splitlines() == [
        "note: eval_only=true is an earlier pipeline's spelling: read as mode=eval",
        "note: init_from=scratch_next_token is an earlier pipeline's spelling: read as init_from=null (fresh weights)",
        "note: checkpoint.load_file=iter_100.ckpt is an earlier pipeline's spelling: read as checkpoint.load_file=100",
    ]
    # this pipeline's own earlier builder name, as a command line or a checkpoint's saved config still spells it
    assert load_config(["model.arch=gpt2"]).model.arch == "gpt" == legacy.model_arch("gpt2")
    assert capsys.readouterr().err.splitlines() == [
        "note: model.arch=gpt2 is an earlier pipeline's spelling: read as model.arch=gpt"
    ]


DATASET_PRESETS = sorted(p.stem for p in (ROOT / "conf" / "dataset").glob("*.yaml"))


@pytest.mark.parametrize("preset", DATASET_PRESETS)
def test_a_dataset_preset_composes_only_the_keys_its_source_reads(preset):
    """`--cfg job` for dataset=X: the section is X's source's class (data/config.py SOURCE_CONFIGS),
    every key of it and none of another source's (no `files` for pystdlib, no `composers` for text)."""
    from data.config import SOURCE_CONFIGS, dataset_schema

    composed = compose_config([f"dataset={preset}"])
    schema = dataset_schema(composed.dataset.source)
    assert OmegaConf.get_type(composed, "dataset") is schema
    keys = set(composed.dataset)
    assert keys == {f.name for f in dataclasses.fields(schema)}
    others = {f.name for c in SOURCE_CONFIGS.values() if c is not schema for f in dataclasses.fields(c)} - keys
    assert others, preset  # every source lacks some key another one reads
    helped = {line.split(":")[0].strip() for line in help_text(Config, composed).splitlines() if ": " in line}
    shown = {key.split(".")[1] for key in helped if key.startswith("dataset.")}  # nested sections by their name
    assert shown == keys, preset


def test_the_cfg_of_a_dataset_preset_and_a_key_of_another_source_on_the_command_line(capsys):
    shown = run_cli(["dataset=music21", "--cfg", "job"], timeout=120)
    assert shown.returncode == 0, shown.stderr
    section = yaml.safe_load(shown.stdout)["dataset"]
    assert "composers" in section and "files" not in section and "bpe_vocab_size" not in section
    refused = run_in_process(["dataset=pystdlib", "dataset.files=[notes]"], capsys)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: config: unknown key 'dataset.files' (python train_jax.py --cfg lists every key); read by "
        "dataset=text_files, json_files, hf, midi_files (pick the source with dataset=...)"
    ]
    helped = run_in_process(["--help"], capsys).stdout  # the section classes are configs, not a group to choose
    assert "\ndataset: fineweb10b, fineweb_edu, hf, json_files" in helped and "dataset_schema" not in helped
    switched = run_in_process(["dataset=pystdlib", "dataset.source=text_files"], capsys)
    assert (
        switched.returncode == 2 and "dataset.source: text_files is chosen with dataset=text_files" in switched.stderr
    )


def test_the_hparams_of_tensorboard_hold_an_infinite_value_as_text():
    """growth_rate=inf (Prodigy's unbounded growth, documented): TensorBoard's hparams table printed `NaN or Inf
    found in input tensor` through tensorboardX's logger at the end of the run."""
    from training.config.nodes import flat_hparams

    hparams = flat_hparams(load_config(["optimizer=prodigy", "optimizer.growth_rate=inf"]))
    assert hparams["optimizer.growth_rate"] == "inf" and hparams["optimizer.lr_config.lr"] == 0.25


def test_a_new_runs_checks_wait_for_a_resume_to_find_nothing_to_resume(finished, data_cache, tmp_path, capsys):
    """A value that a run trained with and a later check refuses (piecewise points past the end, a warm-up longer
    than the run): the run's own command plus checkpoint.load=auto was refused at the door, so it could not be
    continued. Resuming, the saved config wins and the run goes on; where there is nothing to resume, the check
    holds."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    late = ["checkpoint.load=auto", "optimizer/lr_config=piecewise_linear"]
    resumed = run_in_process(tiny_overrides(data_cache, f"logging.run_dir={run_dir}", *late), capsys)
    assert resumed.returncode == 0, resumed.stderr
    assert "nothing left to train" in resumed.stdout
    fresh = run_in_process(tiny_overrides(data_cache, f"logging.run_dir={tmp_path / 'new'}", *late), capsys)
    assert fresh.returncode == 2
    assert fresh.stderr.startswith("error: config: optimizer.lr_config.boundaries: the last point, at step 802")
    assert not (tmp_path / "new").exists()
