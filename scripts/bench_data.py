"""Benchmark the data path on generated corpora: first-run build, second-run start-up, peak memory.

    python scripts/bench_data.py --tokens 10M 100M 1G                # one JSON line per corpus size
    python scripts/bench_data.py --tokens 10M --checkout ../other     # the same runs against another checkout

A corpus of N tokens is generated offline and deterministically from the running Python's standard library (text
that ships here): files of about 256 KB, each the concatenation of standard-library modules under a `# copy k`
header, N bytes in all, so that with `dataset.tokenizer=byte` it holds N tokens plus one <EOS> per file. For each
size the script runs `train_jax.py dataset=text_files dataset.tokenizer=byte model=gpt2-tiny train.max_steps=2` twice
in a fresh process with an empty `dataset.cache_dir` the first time, and reports for each run: wall seconds, seconds
from start to the header's `data` line (config, data, model and state ready: `ready_s`) and to the first step, and
the process's peak resident memory (ru_maxrss). It also times
the tokenizer's own `encode_batch` over the first 64 MB of the corpus, the yardstick for the build's throughput,
which is estimated as tokens / (first run's ready_s - second run's ready_s).
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


def run_once(checkout: Path, corpus: Path, cache: Path, run_dir: Path) -> dict:
    """One training run of 2 steps; times from the process start to the log lines that mark its phases."""
    cmd = [sys.executable, "train_jax.py", "dataset=text_files", f"dataset.files=[{corpus}]", "dataset.tokenizer=byte",
           "dataset.val_fraction=0.1", "dataset.test_fraction=0", f"dataset.cache_dir={cache}", "model=gpt2-tiny",
           "train.max_steps=2", "optimizer.lr_config.warmup=0", "train.batch_size=4", "train.eval_interval=1000",
           "train.eval_iters=1", "checkpoint.save=false", f"logging.run_dir={run_dir}", "logging.tensorboard=false",
           "logging.wandb=disabled"]
    env = dict(os.environ, PYTHONPATH=str(checkout))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marks: dict[str, float] = {}
    lines = []
    for line in proc.stdout:
        lines.append(line)
        now = time.perf_counter() - t0
        if "ready_s" not in marks and re.search(r"\bdata {3,}", line):
            marks["ready_s"] = now
        if "first_step_s" not in marks and "first step done" in line:
            marks["first_step_s"] = now
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit("run failed:\n" + "".join(lines[-20:]))
    return {"wall_s": round(time.perf_counter() - t0, 2), **{k: round(v, 2) for k, v in marks.items()},
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "fork_warning": any("os.fork()" in line for line in lines)}


def encode_batch_rate(corpus: Path, limit: int = 64 << 20) -> float:
    """Bytes/s of the byte tokenizer's own encode_batch over the corpus's first `limit` bytes (in this process)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from data.tokenizers import ByteTokenizer

    texts, size = [], 0
    for path in sorted(corpus.glob("part-*")):
        texts.append(path.read_text(errors="replace"))
        size += len(texts[-1])
        if size >= limit:
            break
    tok = ByteTokenizer()
    t = time.perf_counter()
    tok.encode_batch(texts)
    return size / (time.perf_counter() - t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", nargs="+", default=["10M", "100M"])
    parser.add_argument("--checkout", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--work", default="/tmp/bench_data", help="where corpora, caches and runs go")
    args = parser.parse_args()
    work = Path(args.work)
    for size in args.tokens:
        n = parse_size(size)
        corpus = generate_corpus(work / f"corpus-{size}", n)
        cache = work / f"cache-{size}"
        shutil.rmtree(cache, ignore_errors=True)
        first = run_once(Path(args.checkout), corpus, cache, work / "runs")
        second = run_once(Path(args.checkout), corpus, cache, work / "runs")
        print(json.dumps({"tokens": size, "files": len(list(corpus.glob("part-*"))), "first": first,
                          "second": second, "build_tokens_per_s": round(n / (first["ready_s"] - second["ready_s"])),
                          "encode_batch_tokens_per_s": round(encode_batch_rate(corpus))}), flush=True)
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
