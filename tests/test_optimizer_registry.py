"""An optimizer is a file in optimizers/ and a YAML in conf/optimizer/: a user adds both to a copy of the project
(never to the checkout), and `optimizer=<name>` trains with it, its own hyper-parameter typed and set from the YAML
or the command line; its mistakes are one line each."""

import json
import subprocess
import sys
import textwrap

import pytest

from helpers import communicate, read_metrics, repo_copy, spawn, tiny_overrides
from optimizers import OPTIMIZERS

pytestmark = pytest.mark.e2e

SIGN_MOMENTUM = '''\
"""Sign momentum: the sign of a momentum of the gradients, times step_scale."""

from __future__ import annotations

import optax

from optimizers.registry import register


@register("sign_momentum")
def sign_momentum(model, *, momentum: float, step_scale: float) -> optax.GradientTransformation:
    return optax.chain(optax.trace(decay=momentum), optax.scale_by_sign(), optax.scale(-step_scale))
'''

SIGN_MOMENTUM_YAML = """\
# Sign momentum: sign of the momentum; step_scale multiplies the lr.
defaults:
  - lr_config: cosine
name: sign_momentum
momentum: 0.9
step_scale: 0.5
weight_decay: 0.0
grad_clip: 1.0
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A copy of the project with sign_momentum added as a user would: one file in optimizers/, one in
    conf/optimizer/."""
    root = repo_copy(tmp_path_factory.mktemp("project"))
    (root / "optimizers" / "sign_momentum.py").write_text(SIGN_MOMENTUM)
    (root / "conf" / "optimizer" / "sign_momentum.yaml").write_text(SIGN_MOMENTUM_YAML)
    (root / "conf" / "optimizer" / "typo.yaml").write_text(
        SIGN_MOMENTUM_YAML.replace("name: sign_momentum", "name: sign_momentum\nstep: 2")
    )
    return root


def run_in(project, args, timeout=300):
    """A command of the copied project, with only the copy on the import path."""
    proc = spawn(
        [sys.executable, *args],
        env={"PYTHONPATH": str(project)},
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return communicate(proc, timeout)


def test_an_optimizer_added_as_a_file_and_a_yaml_trains(project, data_cache, tmp_path):
    run_dir = tmp_path / "run"
    result = run_in(
        project,
        [
            "train_jax.py",
            *tiny_overrides(
                data_cache,
                "optimizer=sign_momentum",
                "optimizer.lr_config.lr=2e-3",
                "train.max_steps=12",
                "train.eval_interval=12",
                "train.eval_at_start=true",
                f"logging.run_dir={run_dir}",
            ),
        ],
    )
    assert result.returncode == 0, result.stderr[-3000:]
    saved = (run_dir / "config.yaml").read_text()
    assert "name: sign_momentum" in saved and "step_scale: 0.5" in saved
    train = {r["step"]: r["loss"] for r in read_metrics(run_dir, "train")}
    val = {r["step"]: r["loss"] for r in read_metrics(run_dir, "val")}
    assert max(train) == 12 and train[12] < train[1] - 0.3, train
    assert val[12] < val[0] - 0.3, val


BUILT = textwrap.dedent("""
    import json, sys
    import equinox as eqx, jax, jax.numpy as jnp
    from models.config import GPTConfig
    from models.gpt import GPT
    from optimizers import build_optimizer, build_schedule
    from training.config import load_config
    from core.errors import ConfigError

    cfg = load_config(["optimizer=sign_momentum", "optimizer.step_scale=0.25", "optimizer.grad_clip=0",
                       "optimizer/lr_config=constant", "optimizer.lr_config.lr=0.1", "optimizer.lr_config.warmup=0"])
    model = GPT.init(GPTConfig(vocab_size=259, n_layer=1, n_head=2, n_embd=32, context_size=16), jax.random.PRNGKey(0))
    params = eqx.filter(model, eqx.is_array)
    optimizer = build_optimizer(cfg.optimizer, build_schedule(cfg.optimizer.lr_config, 10), model, 1)
    grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(1), x.shape), params)
    updates, _ = jax.jit(optimizer.update)(grads, optimizer.init(params), params)
    sizes = sorted({round(float(x), 7) for u in jax.tree.leaves(updates) for x in jnp.unique(jnp.abs(u))})
    errors = {}
    for case in sys.argv[1:]:
        try:
            load_config(case.split(), num_local_devices=8)
            errors[case] = None
        except ConfigError as e:
            errors[case] = str(e)
    print(json.dumps({"sizes": sizes, "errors": errors}))
""")

MISTAKES = {
    "optimizer=sign_momentum optimizer.step_scale=null": "config: optimizer.step_scale: sign_momentum needs a value; "
    "set it in conf/optimizer/sign_momentum.yaml",
    "optimizer=adamw optimizer.step_scale=0.5": "config: optimizer.step_scale: adamw does not take it (it is "
    "sign_momentum's); leave it null",
    "optimizer=typo": "config: conf/optimizer/typo.yaml: optimizer.step: Key 'step' not in 'OptimizerConfig' (an "
    "optimizer's hyper-parameters are the keyword arguments of its builder in optimizers/)",
    # every optimizer of the project, and the copy's own
    "optimizer.name=sign_momentums": f"config: optimizer.name: must be one of "
    f"{', '.join(sorted([*OPTIMIZERS, 'sign_momentum']))}; got 'sign_momentums'",
    "optimizer=sign_momentum": None,
}


def test_the_new_hyper_parameter_reaches_the_builder_and_mistakes_are_named(project):
    """Every update of sign_momentum is lr x step_scale in size (the value given on the command line, not the YAML's); a
    value missing, set for another optimizer, a YAML key no builder takes, or an unknown name: one line each."""
    result = run_in(project, ["-c", BUILT, *MISTAKES], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["sizes"] == [0.025]
    for case, message in MISTAKES.items():
        got = report["errors"][case]
        assert got is None if message is None else (got or "").startswith(message), (case, got)


def test_a_wrong_type_for_the_new_key_exits_2_with_one_line(project, tmp_path):
    result = run_in(
        project,
        ["train_jax.py", "optimizer=sign_momentum", "optimizer.step_scale=abc", f"logging.run_dir={tmp_path}/run"],
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: config: optimizer.step_scale: Value 'abc' of type 'str' could not be converted to Float"
    ]
    assert not (tmp_path / "run").exists()
