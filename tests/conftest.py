"""Test set-up: 8 simulated CPU devices, wandb offline and quiet, one shared data cache per session."""

import os

# Before JAX starts: 8 host devices, so sharded and single-device runs can be compared in one process.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

import helpers  # noqa: E402


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    """Whatever a test started is killed with its process group when the test ends, passed, failed or timed out
    (also when a module fixture's run was what timed out)."""
    helpers.kill_started()


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> str:
    """Tokenised datasets, trained tokenizers and compiled executables, shared by every test and its subprocesses
    (each xdist worker has its own)."""
    from training.compilation import init_compilation_cache

    cache = tmp_path_factory.mktemp("data-cache")
    init_compilation_cache(str(cache / "jax"))
    return str(cache)


@pytest.fixture(scope="session")
def bach_chorale():
    """A real piece: a Bach chorale from the score corpus that ships with music21, as notes in seconds."""
    from music21 import corpus

    from data.note_sources import score_notes

    return score_notes(corpus.parse("bach/bwv66.6", forceSource=True), default_velocity=80)
