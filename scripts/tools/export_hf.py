"""Export a checkpoint as a Hugging Face folder that transformers loads: a GPT-2 model as `GPT2LMHeadModel`, a
Llama-style one (model=llama-*: rotary, RMSNorm, SwiGLU) as `LlamaForCausalLM`.

    python -m scripts.tools.export_hf RUN_OR_CHECKPOINT_DIR OUT_DIR [--which latest|best|STEP] [--architecture ARCH]

`--architecture auto` (the default) writes GPT-2 where GPT-2 expresses the model, else Llama (`gpt2`, `llama`: that
one or an error); a model neither expresses (e.g. model=modern-gpt: ReLU^2, QK-norm, a logit soft-cap) is refused in
one line (exit 2). Writes config.json and model.safetensors (float32), tokenizer.json for a BPE tokenizer (a `bpe`
run's tokenizer is a HF `tokenizers` BPE), and gpt_jax_tokenizer.json so that `init_from=hf:OUT_DIR` gets this exact
tokenizer back.
"""

from __future__ import annotations

import sys
from pathlib import Path

from core.arguments import OneLineParser
from core.errors import ConfigError, PipelineError, say
from models.hf import ARCHITECTURES, export_hf
from training.checkpoints.locate import checkpoints_folder_of
from training.checkpoints.storage import check_writable
from training.checkpoints.trained import add_checkpoint_arguments, load_trained


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    add_checkpoint_arguments(parser, "checkpoint")
    parser.add_argument("out_dir", help="the transformers folder to write")
    parser.add_argument(
        "--architecture",
        choices=ARCHITECTURES,
        default="auto",
        help="the transformers class to write: auto = gpt2 where it expresses the model, else llama",
    )
    args = parser.parse_args(argv)
    try:
        check_writable("out_dir", args.out_dir)  # before the checkpoint is read: a file or unwritable place there
        check_not_among_steps(Path(args.out_dir).expanduser())
        trained = load_trained(args.checkpoint, args.which, ("checkpoint", "--which"))
        written = export_hf(trained.model, trained.tokenizer, args.out_dir, args.architecture)
    except PipelineError as e:
        return say(e)
    note = (
        ""
        if trained.tokenizer.kind == "bpe"
        else (
            f" (a {trained.tokenizer.kind} tokenizer has no transformers form: "
            f"ids 0..{trained.tokenizer.vocab_size - 1} "
            "are this project's; gpt2's first 50,257 ids are GPT-2's own)"
        )
    )
    print(f"step {trained.step} of {args.checkpoint} -> {args.out_dir}: {', '.join(written)}{note}")
    return 0


def check_not_among_steps(out: Path) -> None:
    """Not in a run's checkpoints folder (locate.checkpoints_folder_of): beside the steps a folder named like one
    (`checkpoints/12`) became the run's newest step, which every tool and resume then failed to read; inside a step
    (`checkpoints/8/hf`) the export was deleted with the step when max_to_keep rotated it out."""
    if (folder := checkpoints_folder_of(out)) is not None:
        raise ConfigError(f"out_dir: {out} is in {folder}, a run's checkpoints folder; choose a folder outside it")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
