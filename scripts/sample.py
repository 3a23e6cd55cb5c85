"""Generate text from a trained model.

    python scripts/sample.py RUN_DIR [--which latest|best|STEP] [--prompt "def "] [--num-samples 3]
        [--max-new-tokens 200] [--temperature 0.8] [--top-k 50] [--top-p 0.95] [--seed 0]

RUN_DIR is a run directory (runs/<name>) or its checkpoint directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.sampling import generate_no_cache  # noqa: E402
from training.errors import PipelineError  # noqa: E402
from training.trained import load_trained  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="run directory or checkpoint directory")
    parser.add_argument("--which", default="latest", help="latest, best or a step number")
    parser.add_argument("--prompt", action="append", help="prompt text (repeatable); default: the start of a document")
    parser.add_argument("--num-samples", type=int, default=1, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        trained = load_trained(args.path, args.which)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    tok = trained.tokenizer
    texts = args.prompt or [""]
    prompts = [[tok.eos_id] + tok.encode(text) for text in texts for _ in range(args.num_samples)]
    continuations = generate_no_cache(trained.model, prompts, args.max_new_tokens, temperature=args.temperature,
                                      top_k=args.top_k, top_p=args.top_p, seed=args.seed, eos_id=tok.eos_id)
    print(f"# {trained.cfg.model.name}, step {trained.step}, temperature {args.temperature}")
    for prompt_ids, ids in zip(prompts, continuations):
        print("-" * 60)
        print(tok.decode(prompt_ids[1:] + ids))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
