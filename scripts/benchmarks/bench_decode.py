"""Decode speed with and without the KV cache: tokens/s for a model built from a config (random weights: speed does
not depend on them), after one warm-up call of each (compilation is reported apart). One JSON line out.

    python -m scripts.benchmarks.bench_decode [--new-tokens 256] [--batch 1] [--prompt-len 1] [--vocab 4096] [...]
"""

from __future__ import annotations

import json
import sys
import time

import jax

from core.arguments import OneLineParser, at_least
from core.errors import PipelineError, say
from models import MODEL_BUILDERS
from models.decode import generate
from models.sampling import generate_no_cache
from training import config as config_lib


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=at_least(1), default=256)
    parser.add_argument("--batch", type=at_least(1), default=1)
    parser.add_argument("--prompt-len", type=at_least(1), default=1)
    parser.add_argument("--vocab", type=at_least(1), default=4096)
    args, overrides = parser.parse_known_args(argv)
    if flags := [o for o in overrides if o.startswith("-")]:
        parser.error(f"unrecognized arguments: {' '.join(flags)}")
    try:
        cfg = config_lib.load_config(overrides)
    except PipelineError as e:
        return say(e)
    # past the context, `generate` decodes without its cache (the window slides): those tokens time both decoders alike
    past = max(args.prompt_len + args.new_tokens - cfg.model.context_size, 0)
    if past:
        print(
            f"bench_decode: {past} of the {args.new_tokens} new tokens are past model.context_size="
            f"{cfg.model.context_size}, where the cached decoder decodes without its cache; at most "
            f"{max(cfg.model.context_size - args.prompt_len, 0)} time the cache alone",
            file=sys.stderr,
        )
    model = MODEL_BUILDERS[cfg.model.arch](cfg, args.vocab, jax.random.PRNGKey(0))
    prompts = [[(7 * r + i) % args.vocab for i in range(args.prompt_len)] for r in range(args.batch)]
    result = {
        "model": cfg.model.name,
        "context": cfg.model.context_size,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "new_tokens_past_context": past,
        "device_kind": jax.devices()[0].device_kind,
    }
    for name, fn in (("kv_cache", generate), ("no_cache", generate_no_cache)):
        started = time.perf_counter()
        fn(model, prompts, args.new_tokens, temperature=0.0)  # warm-up: compiles
        first = time.perf_counter() - started
        started = time.perf_counter()
        out = fn(model, prompts, args.new_tokens, temperature=0.0)
        seconds = time.perf_counter() - started
        tokens = sum(len(o) for o in out)
        result[name] = {
            "tokens_per_s": round(tokens / seconds, 1),
            "seconds": round(seconds, 3),
            "compile_and_first_call_s": round(first, 2),
        }
    result["speedup"] = round(result["kv_cache"]["tokens_per_s"] / result["no_cache"]["tokens_per_s"], 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
