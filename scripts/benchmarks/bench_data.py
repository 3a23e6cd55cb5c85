"""Benchmark the data path on generated corpora: first-run build, second-run start-up, peak memory.

    python -m scripts.benchmarks.bench_data --tokens 10M 100M 1G                # one JSON line per corpus size
    python -m scripts.benchmarks.bench_data --tokens 10M --checkout ../other  # the same runs against another checkout
    python -m scripts.benchmarks.bench_data --tokens 10M 100M --tokenizer bpe  # a trained BPE (4096 ids), not bytes

A corpus of N tokens is generated offline and deterministically from the running Python's standard library (text
that ships here): files of about 256 KB, each the concatenation of standard-library modules under a `# copy k`
header, N bytes in all, so that with `dataset.tokenizer=byte` it holds N tokens plus one <EOS> per file. For each
size the script runs `train_jax.py dataset=text_files dataset.tokenizer=byte model=gpt2-tiny train.max_steps=2` twice
in a fresh process with an empty `dataset.cache_dir` the first time, each run in a fresh run folder under `--work`
(`runs/<size>-first`, `runs/<size>-second`, emptied before the run), and reports for each run: wall seconds, seconds
from start to the header's `data` line (config, data, model and state ready: `ready_s`) and to the first step, and
the process's peak resident memory (its VmHWM as it exits). The build itself is then timed on its own: the token
store is deleted and built again by `data.packing.tokenized_corpus` in a process of the checkout's (the documents read
before the clock starts), which gives `build_s` and `build_tokens_per_s` (null, with a note on stderr, for a checkout
without that function). The yardstick for the build's throughput is the tokenizer's own `encode_documents` (what the
build calls), timed in this process over the corpus's first 64 MB (bytes), `ENCODE_BATCH_DOCS` documents per call as
the build does. With `--tokenizer bpe` a first run trains the BPE (cached under the corpus's fingerprint), its token
store is deleted, and the two runs above follow, so that the build's figure does not include the BPE's training.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from core.arguments import OneLineParser

FILE_BYTES = 256 << 10
# The run's own peak resident memory (VmHWM of its address space), printed as it exits. Not the rusage that wait4
# gives the parent: Linux carries a process's high-water mark across fork and exec, so a child started from this
# (large) process would report at least this process's size.
PEAK_RSS_AT_EXIT = (
    "import atexit, runpy, sys; sys.argv = sys.argv[1:]; "
    "atexit.register(lambda: print('peak_rss_kb=' + [l.split()[1] for l in open('/proc/self/status') "
    "if l.startswith('VmHWM')][0], flush=True)); runpy.run_path(sys.argv[0], run_name='__main__')"
)
UNITS = {"K": 10**3, "M": 10**6, "G": 10**9}


def parse_size(text: str) -> int:
    """A corpus size for argparse: bytes, or a number with K, M or G (10**3, 10**6, 10**9), at least 1."""
    unit = UNITS.get(text[-1:].upper(), 1)
    number = text[:-1] if unit > 1 else text
    try:
        size = int(float(number) * unit)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}; write bytes or a number with K, M or G") from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"a corpus holds at least 1 byte; got {text!r}")
    return size


def generate_corpus(out: Path, total_bytes: int) -> Path:
    """`total_bytes` of standard-library text in files of about FILE_BYTES; reused when already complete."""
    done = out / "COMPLETE"
    if done.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    root = Path(sysconfig.get_paths()["stdlib"])
    modules = [p.read_bytes() for p in sorted(root.glob("*.py"))]
    written, copy, index, f_index = 0, 0, 0, 0
    while written < total_bytes:
        parts, size = [], 0
        while size < FILE_BYTES and written + size < total_bytes:
            text = b"# copy %d\n" % copy + modules[index]
            parts.append(text[: total_bytes - written - size])
            size += len(parts[-1])
            index += 1
            if index == len(modules):
                index, copy = 0, copy + 1
        (out / f"part-{f_index:05d}.py").write_bytes(b"".join(parts))
        written, f_index = written + size, f_index + 1
    done.write_text(str(total_bytes))
    return out


def dataset_overrides(corpus: Path, cache: Path, tokenizer: str) -> list[str]:
    return [
        "dataset=text_files",
        f"dataset.files=[{corpus}]",
        f"dataset.tokenizer={tokenizer}",
        "dataset.val_fraction=0.1",
        "dataset.test_fraction=0",
        f"dataset.cache_dir={cache}",
    ]


def run_once(checkout: Path, corpus: Path, cache: Path, run_dir: Path, tokenizer: str) -> dict:
    """One training run of 2 steps in the fresh run folder `run_dir` (train_jax.py refuses one that holds a trained
    run); times from the process start to the log lines that mark its phases."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        sys.executable,
        "-c",
        PEAK_RSS_AT_EXIT,
        "train_jax.py",
        *dataset_overrides(corpus, cache, tokenizer),
        "model=gpt2-tiny",
        "train.max_steps=2",
        "optimizer.lr_config.warmup=0",
        "train.batch_size=4",
        "train.eval_interval=1000",
        "train.eval_iters=1",
        "checkpoint.save=false",
        f"logging.run_dir={run_dir}",
        "logging.tensorboard=false",
        "logging.wandb=disabled",
    ]
    t0 = time.perf_counter()
    # `python -c` puts the working directory first on sys.path: the checkout's modules, whatever is installed
    proc = subprocess.Popen(cmd, cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marks: dict[str, float] = {}
    lines = []
    for line in proc.stdout:
        lines.append(line)
        now = time.perf_counter() - t0
        if "ready_s" not in marks and re.search(r"\bdata {3,}", line):
            marks["ready_s"] = now
        if "first_step_s" not in marks and "first step done" in line:
            marks["first_step_s"] = now
        if line.startswith("peak_rss_kb="):
            marks["peak_rss_mb"] = int(line.split("=")[1]) / 1024
    if proc.wait() != 0:
        raise SystemExit("run failed:\n" + "".join(lines[-20:]))
    return {
        "wall_s": round(time.perf_counter() - t0, 2),
        **{k: round(v, 2) for k, v in marks.items()},
        "fork_warning": any("os.fork()" in line for line in lines),
    }


def store_tokens(cache: Path) -> int | None:
    """Tokens in every split of the token store the runs built (None for a checkout from before the store)."""
    metas = [json.loads(p.read_text()) for p in cache.glob("tokens/*/store.json")]
    return sum(split["tokens"] for split in metas[0]["splits"].values()) if metas else None


# Run in the checkout (`python -c`, its modules first on sys.path): the token store of the runs' dataset deleted and
# built again, timed from after the documents are read to the store's completion. Prints the seconds.
BUILD_TIMER = """
import json, shutil, sys, time
from pathlib import Path
from data.corpus import load_corpus
from data.packing import tokenized_corpus
from data.tokenizers import tokenizer_from_json
from training.config import load_config
overrides, tokenizer = json.loads(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
d = load_config(overrides).dataset
corpus = load_corpus(d)
corpus.datasets
shutil.rmtree(Path(d.cache_dir) / 'tokens', ignore_errors=True)
t = time.perf_counter()
tokenized_corpus(corpus, tokenizer_from_json(tokenizer), d)
print('build_s=%f' % (time.perf_counter() - t))
"""


def time_build(checkout: Path, corpus: Path, cache: Path, tokenizer: dict) -> float | None:
    """Seconds the checkout's `tokenized_corpus` takes to build the corpus's token store again, the documents read
    first; None (and a note on stderr) where the checkout cannot do that (one from before the token store)."""
    overrides = dataset_overrides(corpus, cache, tokenizer["kind"])
    path = cache / "bench-tokenizer.json"  # a file: a trained BPE is longer than a command line may be
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(tokenizer))
    cmd = [sys.executable, "-c", BUILD_TIMER, json.dumps(overrides), str(path)]
    proc = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True)
    found = re.search(r"^build_s=([0-9.]+)$", proc.stdout, re.MULTILINE)
    if proc.returncode != 0 or found is None:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print(
            f"note: the build could not be timed on its own in {checkout} ({last}); build_tokens_per_s is null",
            file=sys.stderr,
        )
        return None
    return float(found.group(1))


def run_tokenizer(cache: Path, kind: str) -> dict:
    """The runs' tokenizer as JSON: bytes, or the BPE the runs trained (cached under the corpus's fingerprint)."""
    if kind == "byte":
        return {"kind": "byte"}
    (path,) = cache.glob("tokenizers/bpe-*.json")
    return json.loads(path.read_text())


def encode_rate(corpus: Path, tokenizer: dict, limit: int = 64 << 20) -> float:
    """Tokens/s of the tokenizer's own `encode_documents` (what the build calls; its tokens include each document's
    <EOS>) over the corpus's first `limit` bytes, ENCODE_BATCH_DOCS documents per call as the build does (in this
    process)."""
    from data.packing import ENCODE_BATCH_DOCS
    from data.tokenizers import tokenizer_from_json

    texts, size = [], 0
    for path in sorted(corpus.glob("part-*")):
        data = path.read_bytes()
        texts.append(data.decode("utf-8", errors="replace"))
        size += len(data)
        if size >= limit:
            break
    tok = tokenizer_from_json(tokenizer)
    tokens, t = 0, time.perf_counter()
    for i in range(0, len(texts), ENCODE_BATCH_DOCS):
        flat, _ = tok.encode_documents(texts[i : i + ENCODE_BATCH_DOCS])
        tokens += len(flat)
    return tokens / (time.perf_counter() - t)


def per_core(rate: float | None) -> int | None:
    return None if rate is None else round(rate / (os.cpu_count() or 1))


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", nargs="+", default=["10M", "100M"], type=sized, metavar="SIZE")
    parser.add_argument("--checkout", default=str(Path(__file__).resolve().parents[2]))
    parser.add_argument("--work", default="/tmp/bench_data", help="where corpora, caches and runs go")
    parser.add_argument("--tokenizer", choices=("byte", "bpe"), default="byte")
    args = parser.parse_args(argv)
    work, checkout = Path(args.work), Path(args.checkout)
    for size, corpus_bytes in args.tokens:
        corpus = generate_corpus(work / f"corpus-{size}", corpus_bytes)
        cache = work / f"cache-{size}"
        shutil.rmtree(cache, ignore_errors=True)
        trained = None

        def run(name: str) -> dict:
            return run_once(checkout, corpus, cache, work / "runs" / f"{size}-{name}", args.tokenizer)

        if args.tokenizer == "bpe":
            trained = run("bpe-training")
            shutil.rmtree(cache / "tokens")
        first, second = run("first"), run("second")
        tokenizer = run_tokenizer(cache, args.tokenizer)
        tokens = store_tokens(cache) or corpus_bytes  # bytes = tokens for the byte tokenizer
        build_s = time_build(checkout, corpus, cache, tokenizer)
        build = tokens / build_s if build_s else None
        encode = encode_rate(corpus, tokenizer)
        print(
            json.dumps(
                {
                    "corpus_bytes": corpus_bytes,
                    "tokenizer": args.tokenizer,
                    "tokens": tokens,
                    "files": len(list(corpus.glob("part-*"))),
                    **({"bpe_training_run": trained} if trained else {}),
                    "first": first,
                    "second": second,
                    "build_s": None if build_s is None else round(build_s, 3),
                    "build_tokens_per_s": None if build is None else round(build),
                    "build_tokens_per_s_per_core": per_core(build),
                    "encode_documents_tokens_per_s": round(encode),
                    "encode_over_build": None if build is None else round(encode / build, 2),
                }
            ),
            flush=True,
        )
        shutil.rmtree(cache, ignore_errors=True)
    return 0


def sized(text: str) -> tuple[str, int]:
    """`--tokens`' values: the size as written (the corpus's folder name) and its bytes."""
    return text, parse_size(text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
