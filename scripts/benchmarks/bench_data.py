"""Benchmark the data path on generated corpora: first-run build, second-run start-up, peak memory.

    python -m scripts.benchmarks.bench_data --tokens 10M 100M 1G                # one JSON line per corpus size
    python -m scripts.benchmarks.bench_data --tokens 10M --checkout ../other  # the same runs against another checkout
    python -m scripts.benchmarks.bench_data --tokens 10M 100M --tokenizer bpe  # a trained BPE (4096 ids), not bytes

A corpus of N tokens is generated offline and deterministically from the running Python's standard library (text
that ships here): files of about 256 KB, each the concatenation of standard-library modules under a `# copy k`
header, N bytes in all, so that with `dataset.tokenizer=byte` it holds N tokens plus one <EOS> per file. For each
size the script runs `train_jax.py dataset=text_files dataset.tokenizer=byte model=gpt2-tiny train.max_steps=2` twice
in a fresh process with an empty `dataset.cache_dir` the first time, and reports for each run: wall seconds, seconds
from start to the header's `data` line (config, data, model and state ready: `ready_s`) and to the first step, and
the process's peak resident memory (its VmHWM as it exits). It also times
the tokenizer's own `encode_batch` over the first 64 MB of the corpus, the yardstick for the build's throughput,
which is estimated as tokens / (first run's ready_s - second run's ready_s). With `--tokenizer bpe` a first run
trains the BPE (cached under the corpus's fingerprint), its token store is deleted, and the two runs above follow,
so that the build's figure does not include the BPE's training.
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
    return int(float(text[:-1]) * UNITS[text[-1].upper()]) if text[-1].upper() in UNITS else int(text)


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


def run_once(checkout: Path, corpus: Path, cache: Path, run_dir: Path, tokenizer: str) -> dict:
    """One training run of 2 steps; times from the process start to the log lines that mark its phases."""
    cmd = [
        sys.executable,
        "-c",
        PEAK_RSS_AT_EXIT,
        "train_jax.py",
        "dataset=text_files",
        f"dataset.files=[{corpus}]",
        f"dataset.tokenizer={tokenizer}",
        "dataset.val_fraction=0.1",
        "dataset.test_fraction=0",
        f"dataset.cache_dir={cache}",
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


def encode_batch_rate(corpus: Path, cache: Path, tokenizer: str, limit: int = 64 << 20) -> float:
    """Tokens/s of the tokenizer's own encode_batch over the corpus's first `limit` bytes (in this process; the
    BPE is the one the runs trained)."""
    from data.tokenizers import ByteTokenizer, tokenizer_from_json

    texts, size = [], 0
    for path in sorted(corpus.glob("part-*")):
        texts.append(path.read_text(errors="replace"))
        size += len(texts[-1])
        if size >= limit:
            break
    if tokenizer == "byte":
        tok = ByteTokenizer()
    else:
        (path,) = cache.glob("tokenizers/bpe-*.json")
        tok = tokenizer_from_json(json.loads(path.read_text()))
    t = time.perf_counter()
    ids = tok.encode_batch(texts)
    return sum(len(x) for x in ids) / (time.perf_counter() - t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", nargs="+", default=["10M", "100M"])
    parser.add_argument("--checkout", default=str(Path(__file__).resolve().parents[2]))
    parser.add_argument("--work", default="/tmp/bench_data", help="where corpora, caches and runs go")
    parser.add_argument("--tokenizer", choices=("byte", "bpe"), default="byte")
    args = parser.parse_args()
    work, checkout = Path(args.work), Path(args.checkout)
    for size in args.tokens:
        corpus = generate_corpus(work / f"corpus-{size}", parse_size(size))
        cache = work / f"cache-{size}"
        shutil.rmtree(cache, ignore_errors=True)
        trained = None
        if args.tokenizer == "bpe":
            trained = run_once(checkout, corpus, cache, work / "runs", "bpe")
            shutil.rmtree(cache / "tokens")
        first = run_once(checkout, corpus, cache, work / "runs", args.tokenizer)
        second = run_once(checkout, corpus, cache, work / "runs", args.tokenizer)
        tokens = store_tokens(cache) or parse_size(size)  # bytes = tokens for the byte tokenizer
        build = tokens / (first["ready_s"] - second["ready_s"])
        encode = encode_batch_rate(corpus, cache, args.tokenizer)
        print(
            json.dumps(
                {
                    "corpus_bytes": size,
                    "tokenizer": args.tokenizer,
                    "tokens": tokens,
                    "files": len(list(corpus.glob("part-*"))),
                    **({"bpe_training_run": trained} if trained else {}),
                    "first": first,
                    "second": second,
                    "build_tokens_per_s": round(build),
                    "build_tokens_per_s_per_core": round(build / (os.cpu_count() or 1)),
                    "encode_batch_tokens_per_s": round(encode),
                    "encode_over_build": round(encode / build, 2),
                }
            ),
            flush=True,
        )
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
