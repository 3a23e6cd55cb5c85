"""The GPU measurements of BENCHMARKS.md's GPU section in one run within a time budget, most important first.

    python -m scripts.benchmarks.gpu_suite --nanogpt ~/src/nanoGPT --out runs/gpu-suite            # all, 570 s
    python -m scripts.benchmarks.gpu_suite --nanogpt ~/src/nanoGPT --out runs/gpu-suite --budget 1800
    python -m scripts.benchmarks.gpu_suite --out runs/gpu-suite --only tests,levers                 # some stages
    python -m scripts.benchmarks.gpu_suite --out runs/gpu-suite --only levers --levers vocab,accum  # some levers

Stages, in this order (`--only` picks some; each is a command of its own, its output in OUT/logs/<stage>.log):
  environment  nvidia-smi, and `python check_env.py` after `source activate_env.sh` (which installs this checkout)
  newcomer   `bash scripts/train_lm.sh`, the README's first command: it must train on the GPU
  tests      `bash scripts/test_gpu.sh`: the tests whose behaviour depends on the backend, on the GPU (those that
             compare runs bit for bit on XLA's deterministic kernels)
  data       gpt2's data: a byte-level BPE with GPT-2's 50,257 ids (+2 specials) on pystdlib, then its token store
             (the device may have no Hub access for `dataset.tokenizer=gpt2`), made by `bench.py --loader` (whose
             speed here is no figure: the stages beside it share the machine)
  (the three above run side by side: none is timed against the others; XLA_PYTHON_CLIENT_PREALLOCATE=false)
  profile    gpt2's step traced (`system.profile_steps`), then scripts/tools/profile_summary.py's table
  peer       scripts/benchmarks/bench_peer.py: nanoGPT (torch.compile, flash SDPA, fused AdamW) against ours
  fp8_gemm   scripts/benchmarks/fp8_gemm.py at its default shape and at gpt2's qkv shape: which FP8 forms XLA
             rewrites into FP8 GEMMs
  epilogue   scripts/benchmarks/gemm_epilogue.py at gpt2's MLP input matmul: which forms of the bias and GELU XLA folds
             into cuBLASLt's epilogues, forward and backward, and their speed
  fp8_step   bench.py: gpt2 in bfloat16 and FP8 in one process, then FP8 with Triton's GEMMs off in another: which
             kind of FP8 matmul the step holds (records' custom calls and float8_dots), its compile time and speed
  levers     bench.py, one process: gpt2 at batch 32 in bfloat16 with each lever switched from its default
  big        bench.py: gpt2-xl, -large, -medium and llama-1.5b in bfloat16 and FP8, scanned, with full remat; gpt2-xl
             also with `model.remat=block` and with no remat (at half the batch)
  flags      bench.py, a process per XLA flag (XLA reads its flags once per process), and one with
             system.deterministic=true
  fp8_curve  bench.py: gpt2 for 150 steps in bfloat16 and in FP8, seeds 0 and 1, every step's loss kept
  fp8_deterministic  bench.py: gpt2-tiny in FP8 on XLA's deterministic kernels (the GPU tests' FP8 resume), with
             `model.attention=auto` (XLA's there: cuDNN's failed at its first call on an H100, jax 0.11.2) and with
             `model.attention=cudnn` (since that run, one line at the config's check and exit 2), a process each
The timed stages (profile, peer, fp8_step, levers, big, flags, fp8_curve) share XLA's per-fusion autotuning cache in
OUT/autotune (--xla_gpu_per_fusion_autotune_cache_dir, what JAX's persistent cache turns on): gpt2's first compile
took 82.8 s on an H100 with no cache and 28.7 s in the next process with it, so every process after the first
compiles warm, and its compile_s says so (its record's xla_flags_env names the cache). The tests and the runs on
deterministic kernels (whose autotuning is restricted) go without it.
Every bench.py and bench_peer.py result is kept as a record in OUT/results (scripts/benchmarks/records.py). A stage
starts only while the budget holds its usual length; each gets what is left at most. OUT/summary.json lists each
stage's exit code and seconds; OUT is packed into OUT.tar.gz after every stage (traces left out), so a run cut short
keeps what it had; a later call into the same OUT adds its runs to that summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

from core.arguments import OneLineParser

# gpt2's data, as BENCHMARKS.md's GPU section names it `$C`
GPT2_DATA = ["dataset.tokenizer=bpe", "dataset.bpe_vocab_size=50259"]
BENCH = [sys.executable, "-m", "scripts.benchmarks.bench"]
LEVERS = [  # each against the defaults (on a GPU: unrolled layers, chunked head, bf16 logits, no remat, padded vocab)
    "",
    "model.scan_layers=true",
    "model.head_loss=dense",  # the default on a GPU is the chunked head
    "model.logits_dtype=float32",  # the default on a GPU writes them in the compute dtype
    "model.remat=full",
    "model.remat=full train.batch_size=64",
    "model.vocab_multiple=1",  # 50,259 rows, not padded to 50,304
    "train.batch_size=8 train.grad_accum_steps=4",  # optax.MultiSteps, k = 4, the same 32 sequences a step
    "model.fused_qkv=false",  # three QKV products: no slice copies (~2.4 ms a step by bytes in gpt2's H100 HLO)
    "model.attention=xla",  # last: on an H100 its step had not compiled and run 20 steps after 75 s
    "system.dtype=fp8",
]
FLAGS = [
    "--xla_gpu_enable_triton_gemm=false",
    "--xla_gpu_enable_command_buffer=",
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    "--xla_gpu_autotune_level=0",
]
SIDE_BY_SIDE = {"environment", "newcomer", "tests"}  # the stages that need no gpt2 data
# after those and the data, one at a time, in this order
STAGES = (
    "profile",
    "peer",
    "fp8_gemm",
    "epilogue",
    "fp8_step",
    "levers",
    "big",
    "flags",
    "fp8_curve",
    "fp8_deterministic",
)
ALL_STAGES = ("environment", "newcomer", "tests", "data", *STAGES)
BIG = [  # scanned: unrolled, a 48-layer model's step compiles for minutes (gpt2-xl on a CPU: 212 s against 8 s)
    (  # xl: FP8 against bf16 at full remat, then what recomputes less (full remat is ~1/3 more FLOPs than MFU counts)
        "gpt2-xl",
        [
            "model.remat=full train.batch_size=16",
            "model.remat=full train.batch_size=16 system.dtype=fp8",
            "model.remat=block train.batch_size=16",
            "model.remat=none train.batch_size=8",
        ],
    ),
    ("gpt2-large", ["model.remat=full train.batch_size=16", "model.remat=full train.batch_size=16 system.dtype=fp8"]),
    ("gpt2-medium", ["model.remat=full train.batch_size=32", "model.remat=full train.batch_size=32 system.dtype=fp8"]),
    ("llama-1.5b", ["model.remat=full train.batch_size=16"]),
]


def chosen_levers(picked: str | None) -> list[str]:
    """LEVERS, or the defaults ("") and the levers holding one of the comma-separated substrings of `picked`."""
    if not picked:
        return LEVERS
    chosen = [v for v in LEVERS[1:] if any(p and p in v for p in picked.split(","))]
    if not chosen:
        raise SystemExit(f"error: --levers {picked}: no lever holds any of these; the levers: {', '.join(LEVERS[1:])}")
    return ["", *chosen]


class Suite:
    def __init__(self, args: argparse.Namespace):
        self.out = Path(args.out).resolve()
        self.deadline = time.monotonic() + args.budget
        self.started = time.monotonic()
        self.only = set(filter(None, args.only.split(","))) if args.only else None
        self.args = args
        # a second call into the same OUT (BENCHMARKS.md's GPU sessions make two) adds its runs to the first's
        self.summary: dict[str, dict] = _earlier_summary(self.out / "summary.json")
        self.lock = threading.Lock()
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        data = shlex.split(args.data) if args.data is not None else GPT2_DATA
        self.data = [f"dataset.cache_dir={self.out / 'cache'}", *data]
        self.gpt2 = [f"model={args.model}", *self.data, "system.dtype=bfloat16", f"train.batch_size={args.batch}"]
        held = os.environ.get("XLA_FLAGS", "")
        self.warm = {"XLA_FLAGS": f"{held} --xla_gpu_per_fusion_autotune_cache_dir={self.out / 'autotune'}".strip()}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def wanted(self, stage: str) -> bool:
        return self.only is None or stage in self.only

    def run(self, stage: str, command: list[str], usual: float, env: dict | None = None, most: float = 1e9) -> int:
        """Run one command of a stage if the budget holds its usual length; its output to OUT/logs/<stage>.log."""
        left = self.left()
        if left < usual:
            self.note(stage, {"skipped": f"{left:.0f} s left, usually takes {usual:.0f} s", "command": command})
            return -1
        limit = min(left, most)
        t0 = time.monotonic()
        self.say(f"{stage}: {shlex.join(command)} (at most {limit:.0f} s)")
        with open(self.out / "logs" / f"{stage}.log", "a") as log:
            log.write(f"$ {shlex.join(command)}\n")
            log.flush()
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
            )
            try:
                code = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                code = 124
        seconds = time.monotonic() - t0
        self.note(stage, {"exit": code, "seconds": round(seconds, 1), "command": command})
        self.say(f"{stage}: exit {code} after {seconds:.0f} s")
        self.pack()
        return code

    def note(self, stage: str, entry: dict) -> None:
        with self.lock:
            self.summary.setdefault(stage, {"runs": []})["runs"].append(entry)
            (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1))

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.0f} s] {text}", flush=True)

    def pack(self) -> None:
        """OUT as OUT.tar.gz without traces and caches: what a run cut short still hands back."""
        with self.lock:
            tmp = self.out.with_suffix(".tar.gz.tmp")
            with tarfile.open(tmp, "w:gz") as tar:
                tar.add(self.out, arcname=self.out.name, filter=_small)
            tmp.replace(self.out.with_suffix(".tar.gz"))

    # ---- the stages ----

    def side_by_side(self) -> None:
        """The environment first (activate_env.sh installs this checkout once), then newcomer, tests and data on
        threads of their own: checks, not timings."""
        env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        if self.wanted("environment"):
            command = ["bash", "-c", "nvidia-smi; source activate_env.sh && python check_env.py"]
            self.run("environment", command, usual=5, env=env, most=120)
        threads = [
            threading.Thread(target=self.run, args=(stage, command), kwargs={"usual": 30, "env": env, "most": 300})
            for stage, command in (
                ("newcomer", ["bash", "scripts/train_lm.sh"]),
                ("tests", ["bash", "scripts/test_gpu.sh", "-p", "no:cacheprovider"]),
                ("data", [*BENCH, "--loader", "--steps", "50", *self.gpt2]),
            )
            if self.wanted(stage) or (stage == "data" and self.only - SIDE_BY_SIDE)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def profile(self) -> None:
        run_dir = self.out / "profile-gpt2"
        # XLA's optimised HLO names the kernels (profile_summary.py looks it up); without CUDA graphs every kernel
        # carries its own op's name, so library calls (cuBLAS, cuDNN) are attributed too
        dump = [f"--xla_dump_to={run_dir / 'xla_dump'}", "--xla_dump_hlo_module_re=jit_train_step"]
        flags = "system.xla_flags=[" + ",".join(f"'{f}'" for f in [*dump, "--xla_gpu_enable_command_buffer="]) + "]"
        command = [
            sys.executable,
            "train_jax.py",
            *self.gpt2,
            flags,
            "train.max_steps=14",
            "train.eval_interval=1000",
            "train.log_interval=7",
            "system.profile_steps=[10,12]",
            f"logging.run_dir={run_dir}",
            "logging.wandb=disabled",
            "logging.progress=lines",
            "checkpoint.save=false",
            "system.compilation_cache_dir=null",
        ]
        if self.run("profile", command, usual=40, env=self.warm, most=120) == 0:
            for fmt in ([], ["--json"]):
                self.run(
                    "profile",
                    [sys.executable, "-m", "scripts.tools.profile_summary", str(run_dir), "--top", "25", *fmt],
                    usual=5,
                    most=60,
                )

    def peer(self) -> None:
        if not self.args.nanogpt:
            self.note("peer", {"skipped": "no --nanogpt checkout"})
            return
        a = self.args
        peer = f"--nanogpt {a.nanogpt} --model {a.model} --batch {a.batch} --steps 10 --rounds 6"
        record = ["--record", str(self.out / "results")]
        command = [sys.executable, "-m", "scripts.benchmarks.bench_peer", *peer.split(), *record]
        self.run("peer", command, 90, env=self.warm, most=240)

    def epilogue(self) -> None:
        self.run("epilogue", [sys.executable, "-m", "scripts.benchmarks.gemm_epilogue"], usual=30, most=120)

    def fp8_gemm(self) -> None:
        module = [sys.executable, "-m", "scripts.benchmarks.fp8_gemm"]
        self.run("fp8_gemm", module, usual=20, most=90)
        self.run("fp8_gemm", [*module, "--m", "32768", "--k", "768", "--n", "2304"], usual=20, most=90)

    def bench(
        self, stage: str, common: list[str], variants: list[str], usual: float, steps: int = 20, warm: bool = True
    ) -> int:
        command = [
            *BENCH,
            "--steps",
            str(steps),
            "--record",
            str(self.out / "results"),
            *common,
            "system.compilation_cache_dir=null",
        ]
        for v in variants:
            command += ["--variant", v]
        return self.run(stage, command, usual=usual, env=self.warm if warm else None)

    def levers(self) -> None:
        self.bench("levers", self.gpt2, chosen_levers(self.args.levers), usual=60)

    def big(self) -> None:
        for model, variants in BIG:
            common = [f"model={model}", *self.data, "system.dtype=bfloat16", "model.scan_layers=true"]
            self.bench("big", common, variants, usual=60, steps=8)

    def flags(self) -> None:
        for flag in FLAGS:  # the autotuning flags without the cache (a cached choice would stand in for theirs)
            self.bench("flags", [*self.gpt2, f"system.xla_flags=['{flag}']"], [""], 25, warm="autotune" not in flag)
        # what exact resume on a GPU costs: XLA's deterministic kernels (and XLA's attention where cuDNN's fails there)
        self.bench("flags", [*self.gpt2, "system.deterministic=true"], [""], usual=25, warm=False)

    def fp8_curve(self) -> None:
        curve = [*self.gpt2[:-1], f"train.batch_size={max(1, self.args.batch // 2)}"]
        # two seeds of each: other numerics start another trajectory, so a gap between bf16 and FP8 means something
        # only beside the gap between two seeds (on the CPU, gpt2-micro, the sign of a 0.05-nat gap turned with the
        # seed); two processes of one dtype differ far less and are no measure of it
        variants = ["", "system.dtype=fp8", "train.seed=1", "system.dtype=fp8 train.seed=1"]
        self.bench("fp8_curve", curve, variants, usual=120, steps=150)

    def fp8_step(self) -> None:
        self.bench("fp8_step", self.gpt2, ["", "system.dtype=fp8"], usual=60)
        # a dot of float8 operands that Triton's GEMMs may take (and autotune) goes to cuBLASLt without them
        no_triton = "system.xla_flags=['--xla_gpu_enable_triton_gemm=false']"
        self.bench("fp8_step", [*self.gpt2, "system.dtype=fp8", no_triton], [""], usual=40)

    def fp8_deterministic(self) -> None:
        tiny = ["model=gpt2-tiny", *self.data, "system.dtype=fp8", "system.deterministic=true", "train.batch_size=8"]
        for attention in ("auto", "cudnn"):
            self.bench("fp8_deterministic", [*tiny, f"model.attention={attention}"], [""], 20, steps=3, warm=False)


def _small(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Leave out what is large and can be remade: traces, caches, checkpoints, XLA's dump but the step's HLO."""
    parts = Path(info.name).parts
    remade = ("cache", "autotune", "plugins", "checkpoints", "tensorboard")
    if any(p in remade for p in parts) or info.name.endswith(".pb"):
        return None
    if "xla_dump" in parts[:-1] and not (info.name.endswith("after_optimizations.txt") and "train_step" in parts[-1]):
        return None
    return info


def _earlier_summary(path: Path) -> dict[str, dict]:
    """The summary an earlier call left in OUT, whose runs this call's follow; {} when there is none (or it was cut
    short: what it held is in OUT/logs)."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return earlier if isinstance(earlier, dict) else {}


def main(argv: list[str]) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the folder for logs, records and the summary (made if missing)")
    p.add_argument("--nanogpt", metavar="PATH", help="a nanoGPT checkout, for the peer stage")
    p.add_argument("--budget", type=float, default=570, help="seconds for the whole suite (default 570)")
    p.add_argument("--only", help="comma-separated stages to run (default: all)")
    p.add_argument("--levers", help="the levers stage: only the levers holding one of these comma-separated strings")
    p.add_argument("--model", default="gpt2", help="the model of profile, peer, levers, flags, fp8_curve (gpt2)")
    p.add_argument("--batch", type=int, default=32, help="their batch (32)")
    p.add_argument("--data", help=f'their dataset overrides, one string (default "{" ".join(GPT2_DATA)}")')
    args = p.parse_args(argv)
    chosen_levers(args.levers)  # a --levers that picks nothing is said before anything runs or is written
    unknown = sorted(set(filter(None, args.only.split(","))) - {*SIDE_BY_SIDE, "data", *STAGES}) if args.only else []
    if unknown:  # a misspelt stage ran nothing and reported success
        raise SystemExit(f"error: --only: no stage {', '.join(unknown)}; the stages: {', '.join(ALL_STAGES)}")
    from core.errors import PipelineError, say
    from training.checkpoints.storage import check_writable

    try:
        check_writable("--out", args.out)
    except PipelineError as e:
        return say(e)
    suite = Suite(args)
    suite.side_by_side()
    for stage in STAGES:
        if suite.wanted(stage):
            getattr(suite, stage)()
    suite.say(f"done, {suite.left():.0f} s of the budget left")
    suite.pack()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
