"""Test set-up: 8 simulated CPU devices, wandb offline and quiet, one shared data cache per session, and a hermetic
suite: no test reaches the network or writes into the checkout, and every process a test starts dies with it.

The suite runs on the CPU, also on a machine with a GPU; `pytest -m gpu` (scripts/test_gpu.sh) runs the tests marked
`gpu`, those whose behaviour depends on the backend, on JAX's default backend instead: the GPU where there is one."""

import os
import socket
from importlib.metadata import version

# Before JAX starts, here and in the processes tests start: 8 host devices, so sharded and single-device runs can be
# compared in one process; and XLA:CPU's cheapest code generation, since compiling, not running, is what a test's tiny
# model costs: LLVM's lowest level, and fusions emitted by the classic emitter instead of the MLIR fusion emitters
# (gpt2-tiny's train step compiles in 0.7-1.2 s instead of 3.9-4.0 s at XLA's defaults and its steps take 66-78 ms
# instead of 20 ms, with the same losses: these settings change how XLA:CPU generates machine code, not what it
# computes; under `-m gpu` they reach the GPU's compiler too, where tests are not timed). BENCHMARKS.md has the
# figures. XLA aborts the process on a flag it does not know, and jaxlib 0.11's XLA:CPU has no classic fusion emitter
# left (nor its flag): that flag goes only to the jaxlib that has it.
_CLASSIC_EMITTER = tuple(int(n) for n in version("jaxlib").split(".")[:2]) < (0, 11)
os.environ["XLA_FLAGS"] = " ".join(
    [
        os.environ.get("XLA_FLAGS", ""),
        "--xla_force_host_platform_device_count=8",
        "--xla_backend_optimization_level=0",
        *(["--xla_cpu_use_fusion_emitters=false"] if _CLASSIC_EMITTER else []),
    ]
).strip()
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Before datasets / huggingface_hub are imported: the Hub is never contacted (not even probed), here or in the
# processes tests start; Hub code paths take their offline branch, and local folders load as they do offline.
os.environ["HF_HUB_OFFLINE"] = "1"

import jax  # noqa: E402
import pytest  # noqa: E402

import helpers  # noqa: E402


def pytest_configure(config):
    """The CPU for everything but a selection of `gpu` tests alone (`-m gpu`, `-m "gpu and deterministic"`: it takes
    a test marked gpu and leaves an unmarked one), here, in xdist's workers and in the processes tests start: the rest
    of the suite expects 8 CPU devices and the CPU's kernels. Before anything starts JAX's backend."""
    from _pytest.mark.expression import Expression

    selection = config.option.markexpr
    takes = Expression.compile(selection or "not gpu").evaluate
    gpu = any(takes(lambda name, marks=marks, **_: name in marks) for marks in ({"gpu"}, {"gpu", "deterministic"}))
    if not (gpu and not takes(lambda name, **_: False)):
        os.environ["JAX_PLATFORMS"] = "cpu"
        jax.config.update("jax_platforms", "cpu")


@pytest.fixture
def float32_matmuls():
    """Float32 matmuls in float32 for the test: JAX's default on a recent NVIDIA GPU rounds their operands to TF32 (10
    mantissa bits), which a test of float32 equalities between two programs would read as a bug. The CPU computes
    float32 either way."""
    with jax.default_matmul_precision("float32"):
        yield


LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", "", None, socket.gethostname()}


@pytest.fixture(scope="session", autouse=True)
def scratch(tmp_path_factory):
    """Subprocesses run in a scratch directory (relative defaults like `.cache/jax` land there, not in the checkout),
    and tiktoken's download cache is an empty folder of the session's: nothing read from or written to the machine."""
    helpers.SCRATCH_CWD = tmp_path_factory.mktemp("cwd")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(tmp_path_factory.mktemp("tiktoken-cache"))


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any name lookup or connection beyond this machine, by code running in the test's process, fails the test
    (and fails at once, so that no test waits on a network that happens to be there)."""
    attempts = []

    def refuse(what, host):
        attempts.append(f"{what} {host}")
        raise OSError(f"tests are offline: {what} {host} refused")

    real_getaddrinfo = socket.getaddrinfo
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def getaddrinfo(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name not in LOOPBACK and not str(name).startswith("127."):
            refuse("name lookup of", host)
        return real_getaddrinfo(host, *args, **kwargs)

    def remote(address) -> bool:
        return isinstance(address, tuple) and address[0] not in LOOPBACK and not str(address[0]).startswith("127.")

    def connect(self, address):
        if remote(address):
            refuse("connection to", address)
        return real_connect(self, address)

    def connect_ex(self, address):
        if remote(address):
            refuse("connection to", address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    yield
    assert not attempts, f"the test tried to reach the network: {attempts}"


def pytest_collection_modifyitems(items):
    """Modules with end-to-end tests (whole runs in subprocesses, the longest) first, each module's tests kept
    together: the two workers then finish on short tests at about the same time, instead of one idling while the
    other runs a last long test."""
    long = {item.module for item in items if item.get_closest_marker("e2e")}
    items.sort(key=lambda item: item.module not in long)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    """Whatever a test started is killed with its process group when the test ends, passed, failed or timed out
    (also when a module fixture's run was what timed out)."""
    helpers.kill_started()


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> str:
    """Tokenised datasets and trained tokenizers, shared by every test of an xdist worker and its subprocesses; and
    compiled executables (helpers.COMPILE_CACHE), shared by both workers and every process they start. One folder for
    all: JAX's cache key holds the folder's path (XLA's autotuning cache lives in it), so two folders never share an
    entry, and both workers compile the same tiny runs."""
    from training.loop.compilation import init_compilation_cache

    session = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        session = session.parent  # the workers' base folders sit side by side in the session's
    helpers.COMPILE_CACHE = str(session / "compile-cache")
    init_compilation_cache(helpers.COMPILE_CACHE)
    return str(tmp_path_factory.mktemp("data-cache"))


@pytest.fixture(scope="session")
def finished(tmp_path_factory, data_cache):
    """The suite's default tiny run (helpers.tiny_overrides: 8 steps, evaluations and checkpoints at steps 4 and 8),
    trained once per worker, in its process, for the tests that read a finished run or resume from it. Read-only:
    a test that writes to a run copies it first."""
    import train_jax

    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert train_jax.command_line(helpers.tiny_overrides(data_cache, f"logging.run_dir={run_dir}")) == 0
    return run_dir


@pytest.fixture(scope="session")
def bach_chorale():
    """A real piece: a Bach chorale from the score corpus that ships with music21, as notes in seconds."""
    from music21 import corpus

    from data.note_sources import score_notes

    return score_notes(corpus.parse("bach/bwv66.6", forceSource=True), default_velocity=80)
