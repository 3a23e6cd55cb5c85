"""Download FineWeb10B's GPT-2 token shards as the modded-nanogpt speedrun caches them (the Hugging Face dataset
kjj0/fineweb10B-gpt2) into a folder that `dataset=fineweb10b` reads (data/token_shards.py).

    python -m scripts.tools.download_fineweb --shards 8 --folder data/fineweb10B   # 800M training tokens, ~1.8 GB
    python -m scripts.tools.download_fineweb --shards 103                           # all ~10B tokens, ~20 GB

Fetches the validation shard fineweb_val_000000.bin and the training shards fineweb_train_000001.bin onwards (each
~100M tokens, 200 MB), skipping files already there whose header and size check out (one that does not is fetched
again). Needs the network; without it (or with HF_HUB_OFFLINE=1) it stops in one line, exit 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

from core.arguments import OneLineParser
from core.errors import DataError, PipelineError, say
from core.hub import hub_reachable
from data.token_shards import read_shard
from training.checkpoints.storage import check_writable

REPO = "kjj0/fineweb10B-gpt2"


def shard_names(shards: int) -> list[str]:
    """The validation shard, then training shards 1..shards (the dataset numbers its training shards from 1)."""
    return ["fineweb_val_000000.bin", *(f"fineweb_train_{i:06d}.bin" for i in range(1, shards + 1))]


def present(path: Path) -> bool:
    """A whole shard is there already (header and size agree)."""
    try:
        read_shard(path)
        return True
    except (OSError, DataError):
        return False


def one_line(error: BaseException) -> str:
    """The error's type and the first line of its message (some connection errors have none)."""
    first = next(iter(str(error).strip().splitlines()), "").strip()
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8, help="training shards of ~100M tokens (1..103; default 8)")
    parser.add_argument("--folder", default="data/fineweb10B", help="where to put them (default data/fineweb10B)")
    args = parser.parse_args(argv)
    if not 1 <= args.shards <= 103:
        parser.error(f"--shards must be in 1..103 (the dataset has 103 training shards); got {args.shards}")
    folder = Path(args.folder)
    try:
        check_writable("--folder", folder)  # a file in the way: one line, before the Hub is asked
    except PipelineError as e:
        return say(e)
    wanted = [name for name in shard_names(args.shards) if not present(folder / name)]
    if not wanted:
        print(f"{folder}: all {args.shards + 1} shards are there")
        return 0
    if not hub_reachable():
        return say(
            DataError(
                f"download_fineweb: the Hugging Face Hub cannot be reached (offline, or HF_HUB_OFFLINE=1); "
                f"{len(wanted)} shards of {REPO} are missing from {folder}: run this where there is a network and "
                "copy the folder"
            )
        )
    from huggingface_hub import hf_hub_download

    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(wanted, start=1):
        print(f"[{i}/{len(wanted)}] {name}", flush=True)
        try:
            # A file there is not whole (`wanted` says so): forced, as without force_download huggingface_hub hands it
            # back unchanged when its saved etag matches the Hub's, or when the Hub does not answer.
            hf_hub_download(
                REPO, name, repo_type="dataset", local_dir=str(folder), force_download=(folder / name).exists()
            )
            read_shard(folder / name)  # the header and the size: a cut download fails here, not in a run
        except DataError as e:
            return say(DataError(f"download_fineweb: {e}"))
        except Exception as e:  # the Hub's errors (HTTP, connection) name neither the file nor what to do
            cause = f" ({one_line(e.__cause__)})" if e.__cause__ is not None else ""  # e.g. "due to the above error"
            return say(DataError(f"download_fineweb: {name} of {REPO}: {one_line(e)}{cause}"))
    print(f"{folder}: {len(wanted)} shards downloaded")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
