"""The command line end to end, in real subprocesses: train, log everywhere, sample; offline Hub datasets fail
clearly."""

import json
import subprocess
import sys

import pytest

from helpers import communicate, read_metrics, run_cli, script_in_process, spawn, tiny_overrides

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, data_cache):
    run_dir = tmp_path_factory.mktemp("e2e") / "run"
    result = run_cli(
        tiny_overrides(
            data_cache,
            f"logging.run_dir={run_dir}",
            "logging.wandb=offline",
            "train.max_steps=40",
            "train.eval_interval=20",
            "train.log_interval=5",
            "logging.plot=true",
            "optimizer.lr_config.lr=3e-3",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir, result


def test_tiny_run_loss_falls(tiny_run):
    run_dir, _ = tiny_run
    train = read_metrics(run_dir, "train")
    assert [r["step"] for r in train] == list(range(5, 41, 5))
    assert train[-1]["loss"] < train[0]["loss"] - 1.0
    val = read_metrics(run_dir, "val")
    assert [r["step"] for r in val] == [20, 40] and val[1]["loss"] < val[0]["loss"]
    for key in ("lr", "grad_norm", "tokens_per_s", "ms_per_step", "tokens_seen", "elapsed_s", "remaining_s"):
        assert key in train[-1]


def test_every_validation_split_reports_loss_perplexity_and_bytes(tiny_run):
    run_dir, result = tiny_run
    final = {r["split"]: r for r in read_metrics(run_dir) if r["step"] == 40 and r["split"] != "train"}
    assert set(final) == {"val", "email", "asyncio", "json"}
    for r in final.values():
        # float64 arithmetic on the logged loss (ln 2 to 6 digits: rel 1e-4 below)
        assert r["perplexity"] == pytest.approx(2.718281828 ** r["loss"], rel=1e-6)
        assert r["bits_per_byte"] == pytest.approx(r["nats_per_byte"] / 0.693147, rel=1e-4)
    assert "final evaluation at step 40" in result.stdout
    for split in final:
        assert f"\n{split} " in result.stdout


def test_run_writes_wandb_offline_and_tensorboard_files(tiny_run):
    run_dir, _ = tiny_run
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1 and list(offline_runs[0].glob("*.wandb"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    for tag in ("train/loss", "train/lr", "train/tokens_per_s", "val/loss", "val/perplexity", "json/loss"):
        assert tag in tags, tags
    assert [e.step for e in events.Scalars("val/loss")] == [20, 40]
    # The hparams table: the run's config beside its final validation loss.
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    hparams = EventAccumulator(str(run_dir / "tensorboard" / "hparams"))
    hparams.Reload()
    (final,) = hparams.Scalars("hparam/val_loss")
    assert final.value == pytest.approx(read_metrics(run_dir, "val")[-1]["loss"], rel=1e-6)  # TensorBoard's float32
    session = HParamsPluginData.FromString(hparams.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    config = session.session_start_info.hparams
    assert config["model.name"].string_value == "gpt2-tiny" and config["train.max_steps"].number_value == 40


def test_tensorboard_is_written_without_importing_torch_which_stays_importable(tmp_path):
    """tensorboardX imports torch when it is installed (as in the test environment): seconds at each run's start for
    nothing, since the run logs plain numbers."""
    script = (
        "import sys\n"
        "from training.reporting.tensorboard_sink import summary_writer\n"
        f"writer = summary_writer()(logdir={str(tmp_path / 'tb')!r})\n"
        "writer.add_scalar('train/loss', 1.5, 3)\n"
        "writer.close()\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
        "import torch\n"
        "print('torch', torch.__version__)\n"
    )
    result = communicate(
        spawn([sys.executable, "-c", script], fresh=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "torch imported: False" in result.stdout and "torch 2." in result.stdout, result.stdout
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(3, 1.5)]


def test_a_resumed_runs_tensorboard_drops_the_steps_a_killed_process_logged_past_the_checkpoint(tmp_path):
    """Killed at step 20 after its checkpoint at 10, a run resumed from 10 logs 11-20 again: metrics.jsonl sets the
    first 11-20 aside, but TensorBoard drew both (train/loss at 1..20, 11..20, 21..). The resumed writer now writes
    TensorBoard's restart marker, and a reader drops the earlier process's steps from 11 on."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from training.reporting.tensorboard_sink import TensorBoard

    first = TensorBoard(tmp_path)
    for step in range(1, 21):
        first.log(step, "train", {"loss": 100.0 + step})
    first.writer.flush()  # what a killed process had written (no close)
    resumed = TensorBoard(tmp_path, start_step=10)
    for step in range(11, 26):
        resumed.log(step, "train", {"loss": float(step)})
    resumed.close(None, None)
    first.writer.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert logged == [(s, 100.0 + s) for s in range(1, 11)] + [(s, float(s)) for s in range(11, 26)]


def test_run_saves_config_and_checkpoint(tiny_run):
    run_dir, _ = tiny_run
    assert (run_dir / "config.yaml").read_text().startswith("mode: train")
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps[-1] == 40
    meta = json.loads((run_dir / "checkpoints" / "40" / "meta" / "metadata").read_text())
    assert (
        meta["step"] == 40 and meta["tokenizer"] == {"kind": "byte"} and meta["config"]["model"]["name"] == "gpt2-tiny"
    )


def test_sample_script_generates_from_the_run(tiny_run, monkeypatch, capsys):
    run_dir, _ = tiny_run
    result = script_in_process(
        "scripts.tools.sample",
        [str(run_dir), "--prompt", "def ", "--max-new-tokens", "20", "--seed", "1"],
        monkeypatch,
        capsys,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    body = result.stdout.split("-" * 60)[1]
    assert body.strip().startswith("def") and len(body.strip()) > len("def")


def test_hub_dataset_offline_fails_with_one_line(tmp_path):
    result = run_cli(
        [
            "dataset=wikitext2",
            f"dataset.cache_dir={tmp_path}/cache",
            f"logging.run_dir={tmp_path}/run",
            "logging.wandb=disabled",
            "system.num_devices=1",
        ],
        timeout=120,
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("error: dataset Salesforce/wikitext (wikitext-2-raw-v1)")
    assert "dataset=pystdlib" in lines[0]


def test_a_finished_run_writes_summary_and_plots(tiny_run, tmp_path):
    from PIL import Image

    from training.reporting.summary import plot_runs

    run_dir, _ = tiny_run
    summary = json.loads((run_dir / "summary.json").read_text())
    val = read_metrics(run_dir, "val")
    assert summary["steps"] == 40 and summary["stopped"] == "max_steps"
    assert summary["splits"]["val"]["final_loss"] == val[-1]["loss"]
    assert summary["splits"]["val"]["best_loss"] == min(r["loss"] for r in val)
    assert summary["tokens_seen"] == read_metrics(run_dir, "train")[-1]["tokens_seen"] == 40 * 8 * 64
    assert summary["checkpoints"]["latest"] == 40 and summary["versions"]["jax"]
    assert summary["tokens_per_s_median"] > 0 and summary["mfu_median"] is None  # CPU: no known peak
    with Image.open(run_dir / "plots.png") as png:
        assert png.format == "PNG" and png.size[0] > 1000
    curves = plot_runs([run_dir], tmp_path / "again.png")
    train = read_metrics(run_dir, "train")
    assert curves["loss per token/run: train"] == ([r["step"] for r in train], [r["loss"] for r in train])
    assert curves["loss per token/run: val"] == ([r["step"] for r in val], [r["loss"] for r in val])
    assert curves["learning rate/run"][1] == [r["lr"] for r in train]
    assert set(k.split(": ")[-1] for k in curves if k.startswith("loss")) == {
        "train",
        "val",
        "email",
        "asyncio",
        "json",
    }


def test_plot_runs_overlays_several_runs(tiny_run, tmp_path, monkeypatch, capsys):
    run_dir, _ = tiny_run
    result = script_in_process(
        "scripts.tools.plot_runs",
        [str(run_dir), str(run_dir), "--labels", "a,b", "--out", str(tmp_path / "cmp.png")],
        monkeypatch,
        capsys,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = script_in_process("scripts.tools.plot_runs", [str(tmp_path)], monkeypatch, capsys)
    assert bad.returncode == 1 and bad.stderr.startswith("error: no metrics.jsonl in")
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "metrics.jsonl").write_text("")  # a run that has not logged a step: a blank figure, exit 0
    bad = script_in_process("scripts.tools.plot_runs", [str(tmp_path / "new")], monkeypatch, capsys)
    assert (bad.returncode, bad.stderr) == (
        1,
        f"error: no training step logged yet in {tmp_path / 'new'}: nothing to plot\n",
    )
