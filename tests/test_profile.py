"""system.profile_steps=[a, b]: a jax.profiler trace of exactly steps a..b in the run directory."""

import gzip
import json

import pytest

from core.errors import ConfigError
from helpers import run_cli, tiny_overrides
from training.config import load_config


def outermost(events, name):
    """The calls of `name` in a trace: the profiler nests a second event of the same name inside each call."""
    calls, end = [], -1.0
    for e in sorted((e for e in events if e.get("name") == name and e.get("ph") == "X"), key=lambda e: e["ts"]):
        if e["ts"] >= end:
            calls.append(e)
            end = e["ts"] + e["dur"]
    return calls


@pytest.mark.e2e
def test_the_trace_holds_the_named_steps_and_nothing_else(data_cache, tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(
        tiny_overrides(
            data_cache,
            f"logging.run_dir={run_dir}",
            "train.max_steps=6",
            "train.eval_interval=100",
            "system.profile_steps=[3,5]",
            "checkpoint.save=false",
        )
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (trace_dir,) = (run_dir / "profile" / "plugins" / "profile").iterdir()
    assert list(trace_dir.glob("*.xplane.pb"))  # TensorBoard's profile plugin reads this one
    events = json.load(gzip.open(trace_dir / "perfetto_trace.json.gz"))["traceEvents"]  # and Perfetto this one
    assert len(outermost(events, "PjitFunction(train_step)")) == 3  # steps 3, 4 and 5
    assert not outermost(events, "PjitFunction(eval_step)")  # the evaluation after step 6 is outside


@pytest.mark.parametrize("steps", ["[3]", "[4,2]", "[0,2]"])
def test_a_bad_profile_range_is_one_config_error(steps):
    with pytest.raises(ConfigError, match=r"system.profile_steps: must be \[first, last\]"):
        load_config([f"system.profile_steps={steps}"], num_local_devices=1)
