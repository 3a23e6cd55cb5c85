"""The `dataset` and `data` sections of the run's config, owned by the package that reads them: where documents or
pieces come from, how they are tokenised and cut up, and the checks on their values. The dataset section is the
class of its source (SOURCE_CONFIGS): each loader of data/corpus.py takes its own."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Optional

from core.checks import fail, require_positive

if TYPE_CHECKING:
    from omegaconf import DictConfig

MIXTURE = "mixture"  # dataset.source of a mixture: load_corpus (data/corpus.py) mixes the sources it lists


class TokenizerKind(StrEnum):
    byte = "byte"  # the 256 bytes + special tokens
    bpe = "bpe"  # byte-level BPE trained on the training split (dataset.bpe_vocab_size)
    gpt2 = "gpt2"  # GPT-2's 50,257 tokens (tiktoken)
    notes = "notes"  # notes sources: SHIFT / PITCH / VEL / DUR tokens (dataset.notes_tokenizer)


@dataclass(frozen=True)
class AugmentationConfig:
    """Notes only, training records only; drawn per record from (seed, sample), so a resumed run sees the same."""

    speed_change_factors: list[float] = field(default_factory=list)  # e.g. [0.9, 1.1]: also play records this fast
    max_pitch_shift: int = 0  # transpose each record by up to this many semitones either way

    def check(self, at: str) -> None:
        if not 0 <= self.max_pitch_shift <= 127:
            fail(f"{at}.max_pitch_shift", f"must be in [0, 127]; got {self.max_pitch_shift}")
        if any(f <= 0 for f in self.speed_change_factors):
            fail(f"{at}.speed_change_factors", f"must all be > 0; got {list(self.speed_change_factors)}")


@dataclass(frozen=True)
class NotesTokenizerConfig:
    time_step: float = 0.01  # seconds per SHIFT / DUR step
    max_shift_steps: int = 100  # largest single SHIFT token; longer gaps take several
    max_duration_steps: int = 100  # largest single DUR token; longer notes take several
    velocity_bins: int = 32  # velocities 0..127 fall into this many equal bins (at most 128)

    def check(self, at: str) -> None:
        require_positive(self, at, "max_shift_steps", "max_duration_steps", "velocity_bins")
        if self.time_step <= 0:
            fail(f"{at}.time_step", f"must be > 0 seconds; got {self.time_step}")
        if self.velocity_bins > 128:
            fail(f"{at}.velocity_bins", f"must be <= 128; got {self.velocity_bins}")


@dataclass(frozen=True)
class DatasetConfig:
    """What every source reads. The section is the class of its source (SOURCE_CONFIGS, chosen by `dataset=...`), so
    `--cfg` and `--help` show only the keys that source reads."""

    name: str = "pystdlib"  # label used in run names
    # where documents (or pieces of notes) come from: a key of data/corpus.py's table of loaders, or mixture; the
    # preset of conf/dataset/ picks it, with the section's class (dataset=pystdlib picks this section)
    source: str = "pystdlib"
    tokenizer: TokenizerKind = TokenizerKind.bpe  # text sources take a text tokenizer, notes sources `notes`
    context_size: Optional[int] = None  # tokens per training window; null = model.context_size
    val_fraction: float = 0.05  # sources without their own splits: share of documents held out per split
    test_fraction: float = 0.05  # ... and the share held out for the test split
    max_documents: Optional[int] = None  # cap on documents per split (streamed corpora: documents read in all)
    docs_per_chunk: int = 4096  # token store: documents per unit of the build (what a killed build redoes at most)
    build_timeout_s: float = 21600.0  # multi-process: how long a process waits for the others' part of the build
    num_proc: int = 2  # processes for parsing scores / MIDI files (spawned workers); text is tokenised in-process
    cache_dir: str = ".cache"  # token stores, trained tokenizers, parsed notes (shared by all processes of a run)

    @property
    def val_by_fraction(self) -> bool:
        """The val split is val_fraction of the documents (text read whole: the standard library, the user's files,
        a dataset without a validation split of its own); notes sources hold out at least one piece."""
        return self.source in ("pystdlib", "text_files", "json_files") or (
            self.source == "hf" and getattr(self, "val_split", None) is None
        )

    @classmethod
    def schema_for(cls, node: DictConfig | None) -> type[DatasetConfig]:
        """The class of a dataset section holding `node`'s values (`--help` shows the chosen source's keys)."""
        return dataset_schema(getattr(node, "source", None) or "pystdlib")

    @property
    def records(self) -> bool:
        """Text fine-tuning: one `prompt <GENAI> completion` record per row instead of packed documents."""
        return False

    @property
    def notes(self) -> bool:
        """Whether the source gives pieces of notes (for the notes tokenizer) rather than text."""
        return isinstance(self, NotesConfig)

    def check(self, at: str = "dataset") -> None:
        """`at`: where this section sits (the run's dataset section, or one source of its mixture)."""
        if self.source not in SOURCE_CONFIGS:
            fail(f"{at}.source", f"must be one of {', '.join(SOURCE_CONFIGS)}; got {self.source!r}")
        if not str(self.cache_dir).strip():  # '' wrote the caches' folders into the working directory
            fail(f"{at}.cache_dir", "must name a directory (e.g. .cache); got an empty path")
        if type(self) is not SOURCE_CONFIGS[self.source]:
            fail(
                f"{at}.source",
                f"{self.source} reads other keys than this {self.name} section holds; choose the source with "
                f"dataset={self.source} (a preset of conf/dataset/), not dataset.source",
            )
        if self.max_documents is not None and self.max_documents < 1:
            fail(f"{at}.max_documents", f"must be >= 1; got {self.max_documents}")
        require_positive(self, at, "docs_per_chunk", "num_proc")
        if self.build_timeout_s <= 0:
            fail(f"{at}.build_timeout_s", f"must be > 0; got {self.build_timeout_s}")
        for key in ("val_fraction", "test_fraction"):
            if not 0.0 <= getattr(self, key) < 0.5:
                fail(f"{at}.{key}", f"must be in [0, 0.5); got {getattr(self, key)}")
        if self.val_fraction == 0 and self.val_by_fraction:  # an empty val split, found after the data loaded
            fail(f"{at}.val_fraction", "0 holds out no validation documents, and a run needs some: e.g. 0.05")
        if self.notes != (self.tokenizer == TokenizerKind.notes):
            fail(
                "dataset.tokenizer",
                f"dataset.source={self.source} needs "
                + (
                    "dataset.tokenizer=notes"
                    if self.notes
                    else f"a text tokenizer ({', '.join(k for k in TokenizerKind if k != TokenizerKind.notes)}), "
                    f"not {self.tokenizer}"
                ),
            )


@dataclass(frozen=True)
class TextConfig(DatasetConfig):
    """Text sources: documents packed into token windows."""

    bpe_vocab_size: int = 4096  # bpe only: size including the byte alphabet and special tokens
    document_mask: bool = False  # packed text: attention stays within a document, positions restart at each one
    # training rows begin at a document (the <EOS> before it standing as its BOS), as the GPT-2 speedrun's batches do;
    # what a row cuts off a document is skipped (data/examples.py DocumentRows). Evaluation's windows are unchanged
    document_starts: bool = False
    max_document_tokens: Optional[int] = None  # document_starts: each document cut to this many tokens (its BOS too)

    def check(self, at: str = "dataset") -> None:
        super().check(at)
        if self.document_starts and self.records:
            fail(
                f"{at}.document_starts",
                "aligns packed documents to the start of each row; records (prompt/completion) start one each "
                "already: set it to false",
            )
        if self.max_document_tokens is not None:
            if not self.document_starts:
                fail(f"{at}.max_document_tokens", "cuts documents of rows that begin at one: set document_starts=true")
            if self.max_document_tokens < 2:
                fail(f"{at}.max_document_tokens", f"must be >= 2 (a BOS and a token); got {self.max_document_tokens}")
        if self.document_mask and self.records:
            fail(
                "dataset.document_mask",
                "masks documents packed into one window; records (prompt/completion) hold one each already: set it "
                "to false",
            )
        if self.tokenizer == TokenizerKind.bpe and self.bpe_vocab_size < 260:
            fail(f"{at}.bpe_vocab_size", f"must be >= 260 (256 bytes + special tokens); got {self.bpe_vocab_size}")
        if self.tokenizer != TokenizerKind.bpe and self.bpe_vocab_size != TextConfig.bpe_vocab_size:
            fail(  # the vocabulary is the tokenizer's own: a size here was dropped without a word
                f"{at}.bpe_vocab_size",
                f"sizes the bpe tokenizer, and dataset.tokenizer is {self.tokenizer}; set dataset.tokenizer=bpe or "
                "drop it",
            )


@dataclass(frozen=True)
class PystdlibConfig(TextConfig):
    """The running Python's standard library: real text, no download."""

    extra_val_splits: list[str] = field(default_factory=list)  # packages held out whole, one validation split each


@dataclass(frozen=True)
class TextFilesConfig(TextConfig):
    """The user's text files: one file, one document."""

    source: str = "text_files"  # the loader (dataset=text_files picks this section)
    files: list[str] = field(default_factory=list)  # paths, directories or globs

    def check(self, at: str = "dataset") -> None:
        super().check(at)
        if not self.files:
            fail(f"{at}.files", "text_files needs at least one path or glob, e.g. dataset.files=[notes/*.txt]")


@dataclass(frozen=True)
class RecordsConfig(TextConfig):
    """Sources of rows with columns: a document's text, or fine-tuning's prompt and completion."""

    text_column: str = "text"  # the column holding a document's text
    prompt_column: Optional[str] = None  # text fine-tuning: records are `prompt <GENAI> completion` from these two
    completion_column: Optional[str] = None  # ... columns; both or neither

    @property
    def records(self) -> bool:
        return bool(self.prompt_column or self.completion_column)

    def check(self, at: str = "dataset") -> None:
        super().check(at)
        if self.records and not (self.prompt_column and self.completion_column):
            fail(
                f"{at}.prompt_column", "text fine-tuning needs both dataset.prompt_column and dataset.completion_column"
            )


@dataclass(frozen=True)
class JsonFilesConfig(RecordsConfig):
    """The user's JSON / JSON-lines files: one row per object."""

    source: str = "json_files"  # the loader (dataset=json_files picks this section)
    files: list[str] = field(default_factory=list)  # .json / .jsonl files, directories or globs

    def check(self, at: str = "dataset") -> None:
        super().check(at)
        if not self.files:
            fail(f"{at}.files", "json_files needs at least one .json/.jsonl file or glob")


@dataclass(frozen=True)
class HfConfig(RecordsConfig):
    """A datasets dataset: from the Hugging Face Hub, or a local folder or files."""

    source: str = "hf"  # the loader (dataset=hf picks this section)
    hf_path: Optional[str] = None  # Hub dataset id, e.g. Salesforce/wikitext (or a builder: json, text, ...)
    hf_name: Optional[str] = None  # dataset config name, e.g. wikitext-2-raw-v1
    files: list[str] = field(default_factory=list)  # local data files for the builder hf_path names
    train_split: str = "train"  # the split that trains
    val_split: Optional[str] = "validation"  # null = hold out val_fraction of the train split
    test_split: Optional[str] = "test"  # null = none of the source's (with val_split=null, test_fraction of train)
    streaming: bool = False  # tokenise while streaming into the token store (needs max_documents or max_tokens)
    max_tokens: Optional[int] = None  # streaming: stop reading after the chunk that reaches this many tokens

    def check(self, at: str = "dataset") -> None:
        super().check(at)
        if not self.hf_path:
            fail(f"{at}.hf_path", "hf needs a Hub dataset id, e.g. dataset.hf_path=Salesforce/wikitext")
        if self.max_tokens is not None and self.max_tokens < 1:
            fail(f"{at}.max_tokens", f"must be >= 1; got {self.max_tokens}")
        if self.max_tokens is not None and not self.streaming:  # a loaded dataset is read whole: it was ignored
            fail(
                f"{at}.max_tokens",
                "caps a streamed build; set dataset.streaming=true, or cap a loaded dataset with dataset.max_documents",
            )
        if not self.streaming:  # the source's own splits, where it has them, leave the fractions unread
            if self.val_split is not None and self.val_fraction != HfConfig.val_fraction:
                fail(
                    f"{at}.val_fraction",
                    f"the source's {self.val_split!r} split validates (dataset.val_split); set dataset.val_split=null "
                    "to hold out val_fraction of train instead",
                )
            if (self.val_split is not None or self.test_split is not None) and (
                self.test_fraction != HfConfig.test_fraction
            ):
                fail(
                    f"{at}.test_fraction",
                    "is held out of train only when dataset.val_split and dataset.test_split are both null (they are "
                    f"{self.val_split or 'null'} and {self.test_split or 'null'}); set them to null, or test_fraction "
                    "back",
                )
        if self.streaming:
            if self.max_documents is None and self.max_tokens is None:
                fail(
                    f"{at}.max_tokens", "streaming needs a cap, e.g. dataset.max_tokens=10000000000 (or max_documents)"
                )
            if self.tokenizer == TokenizerKind.bpe:
                fail(
                    "dataset.tokenizer",
                    "bpe is trained on a whole train split, which a streamed corpus does not "
                    "have before the build; use gpt2 or byte",
                )
            if self.prompt_column:
                fail(
                    f"{at}.streaming", "fine-tuning records (prompt_column) are read whole; set dataset.streaming=false"
                )
            for key in ("val_split", "test_split"):
                if getattr(self, key) is not None:
                    fail(
                        f"{at}.{key}",
                        f"a stream reads only dataset.train_split and holds out val_fraction / test_fraction of it; "
                        f"set dataset.{key}=null (or dataset.streaming=false to read the Hub's {getattr(self, key)!r})",
                    )


@dataclass(frozen=True)
class TokenShardsConfig(TextConfig):
    """Token shards of llm.c's format in a local folder (data/token_shards.py): FineWeb10B as the speedrun caches it."""

    source: str = "token_shards"  # the loader (dataset=fineweb10b picks this section)
    folder: str = "data/fineweb10B"  # the shards' folder (relative: to where the run starts)
    train_files: str = "fineweb_train_*.bin"  # glob of the training shards in folder, read in name order
    val_files: str = "fineweb_val_*.bin"  # glob of the validation shards
    # val's targets evaluated, from its start: its first val_tokens + 1 tokens (the speedrun's 10,485,760); null = all
    val_tokens: Optional[int] = 10485760
    max_train_shards: Optional[int] = None  # the first this many training shards; null = every one

    def check(self, at: str = "dataset") -> None:
        super().check(at)
        if self.tokenizer == TokenizerKind.bpe:
            fail(
                "dataset.tokenizer",
                "token shards are tokenised already: name the tokenizer they were written with (gpt2 for FineWeb10B)",
            )
        for key in ("val_tokens", "max_train_shards"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                fail(f"{at}.{key}", f"must be >= 1 or null; got {getattr(self, key)}")
        for key, instead in SHARDS_INSTEAD.items():
            if getattr(self, key) != DEFAULTS[key]:
                fail(f"{at}.{key}", f"token shards are not read by document: {instead}")


# What token shards read in place of the keys that cut documents into splits (their splits are files, whole shards).
SHARDS_INSTEAD = {
    "val_fraction": "validation is dataset.val_files (dataset.val_tokens of it); set val_fraction back",
    "test_fraction": "they have no test split (dataset.val_files validates); set test_fraction back",
    "max_documents": "cap the training tokens with dataset.max_train_shards (in a mixture, set max_documents on "
    "the other sources' entries)",
}
DEFAULTS = {f.name: f.default for f in dataclasses.fields(DatasetConfig)}


@dataclass(frozen=True)
class MixtureConfig(TextConfig):
    """Several text sources at set weights (training/config/mixture.py)."""

    source: str = MIXTURE  # no loader of its own: the sources listed below
    # the sources and their weights, each a preset of conf/dataset/ with any of its keys changed:
    # [{dataset: fineweb_edu, weight: 0.7}, {dataset: text_files, weight: 0.3, name: mine, files: [notes/]}]
    mixture: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class NotesConfig(DatasetConfig):
    """Notes sources: pieces of (time, pitch, velocity, duration) notes, cut into records."""

    tokenizer: TokenizerKind = TokenizerKind.notes  # SHIFT / PITCH / VEL / DUR tokens (notes_tokenizer)
    default_velocity: int = 80  # scores: velocity before the first dynamic mark
    pause_detection_threshold: float = 4.0  # seconds of silence that split a piece into segments
    eval_composers: list[str] = field(  # composers with a validation split of their own (beside `full`)
        default_factory=lambda: ["bach", "mozart", "beethoven", "chopin"]
    )
    augmentation: AugmentationConfig = field(default_factory=AugmentationConfig)  # how training records vary
    notes_tokenizer: NotesTokenizerConfig = field(default_factory=NotesTokenizerConfig)  # the token grid

    def check(self, at: str = "dataset") -> None:
        super().check(at)
        self.notes_tokenizer.check(f"{at}.notes_tokenizer")
        self.augmentation.check(f"{at}.augmentation")
        if not 1 <= self.default_velocity <= 127:
            fail(f"{at}.default_velocity", f"must be in [1, 127]; got {self.default_velocity}")
        if self.pause_detection_threshold <= 0:
            fail(f"{at}.pause_detection_threshold", f"must be > 0 seconds; got {self.pause_detection_threshold}")


@dataclass(frozen=True)
class Music21Config(NotesConfig):
    """The scores that ship with music21: no download."""

    source: str = "music21"  # the loader (dataset=music21 picks this section)
    composers: list[str] = field(  # the composers whose scores are read
        default_factory=lambda: ["bach", "mozart", "beethoven", "haydn", "chopin"]
    )
    max_pieces_per_composer: Optional[int] = None  # the smallest files first; null = all

    def check(self, at: str = "dataset") -> None:
        super().check(at)
        if self.max_pieces_per_composer is not None and self.max_pieces_per_composer < 1:
            fail(f"{at}.max_pieces_per_composer", f"must be >= 1 (or null for all); got {self.max_pieces_per_composer}")


@dataclass(frozen=True)
class MaestroConfig(NotesConfig):
    """MAESTRO-style piano performances from the Hub (or a local folder)."""

    source: str = "maestro"  # the loader (dataset=maestro picks this section)
    base_dataset_name: Optional[str] = None  # Hub id or local folder giving validation and test
    extra_datasets: list[str] = field(default_factory=list)  # their train splits train (default: base's)
    val_split: Optional[str] = "validation"  # the base dataset's validation split
    test_split: Optional[str] = "test"  # the base dataset's test split

    def check(self, at: str = "dataset") -> None:
        super().check(at)
        if not self.base_dataset_name:
            fail(f"{at}.base_dataset_name", "maestro needs a Hub id or local folder, e.g. epr-labs/maestro-sustain-v2")


@dataclass(frozen=True)
class MidiFilesConfig(NotesConfig):
    """The user's .mid files."""

    source: str = "midi_files"  # the loader (dataset=midi_files picks this section)
    files: list[str] = field(default_factory=list)  # .mid files, directories or globs

    def check(self, at: str = "dataset") -> None:
        super().check(at)
        if not self.files:
            fail(f"{at}.files", "midi_files needs at least one .mid file, folder or glob")


# dataset.source -> the class of its section
SOURCE_CONFIGS: dict[str, type[DatasetConfig]] = {
    "pystdlib": PystdlibConfig,
    "text_files": TextFilesConfig,
    "json_files": JsonFilesConfig,
    "hf": HfConfig,
    "token_shards": TokenShardsConfig,
    "music21": Music21Config,
    "maestro": MaestroConfig,
    "midi_files": MidiFilesConfig,
    MIXTURE: MixtureConfig,
}


def other_sources_hint(key: str) -> str:
    """'; read by dataset=...' for a dataset key that other sources' sections have, else ''."""
    name = key.removeprefix("dataset.")
    if name == key:
        return ""
    readers = [s for s, c in SOURCE_CONFIGS.items() if name in {f.name for f in dataclasses.fields(c)}]
    return f"; read by dataset={', '.join(readers)} (pick the source with dataset=...)" if readers else ""


def dataset_schema(source: object) -> type[DatasetConfig]:
    """The class of a dataset section with this source (the base class for a source no loader has: its check says
    so)."""
    return SOURCE_CONFIGS.get(str(source), DatasetConfig)


@dataclass(frozen=True)
class DataConfig:
    notes_per_record: int = 128  # notes: consecutive notes per training/evaluation record

    def check(self) -> None:
        require_positive(self, "data", "notes_per_record")
