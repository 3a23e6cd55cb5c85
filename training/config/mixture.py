"""`dataset.mixture`: each source a preset of conf/dataset/ with the run's dataset settings it inherits and its own
keys, and the checks on the mixture as a whole."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.checks import fail
from core.errors import ConfigError
from data.batches import allot
from data.config import MIXTURE, DatasetConfig, dataset_schema
from data.mixture import MIXTURE_BLOCK
from training.config.nodes import CONF_DIR, one_line, schema_node

# Keys a mixture's sources take from the run's dataset section unless the entry sets them: where the caches live and
# how the data is cut up are the run's, not a source's. The tokenizer is always the run's (one vocabulary).
MIXTURE_INHERITED = (
    "bpe_vocab_size",
    "context_size",
    "docs_per_chunk",
    "document_mask",
    "document_starts",
    "max_document_tokens",
    "max_documents",
    "build_timeout_s",
    "num_proc",
    "cache_dir",
)
# Keys each source's preset sets for itself (how much of it is held out): on the mixture's own section they would
# reach no source, so a value other than the default there is refused, naming where it goes.
MIXTURE_PER_SOURCE = ("val_fraction", "test_fraction")
MIXTURE_ENTRY_KEYS = ("dataset", "weight")
# Keys that cut every source's rows one way (the rows of a batch share a context and a masking; one vocabulary): the
# run's, so an entry that sets another value is refused, naming the run's key.
MIXTURE_RUN_WIDE = ("context_size", "document_mask", "bpe_vocab_size")


def mixture_sources(d: DatasetConfig) -> list[tuple[str, float, DatasetConfig]]:
    """dataset.mixture as (name, weight, that source's complete dataset section): the entry's preset from
    conf/dataset/, then the keys the run's dataset section lends it (MIXTURE_INHERITED), then the entry's own keys.
    None for a section of another source."""
    if d.source != MIXTURE:
        return []
    sources = []
    for i, entry in enumerate(d.mixture):
        where = f"dataset.mixture[{i}]"
        if not isinstance(entry, dict) or any(k not in entry for k in MIXTURE_ENTRY_KEYS):
            fail(
                where, "needs `dataset` (a preset of conf/dataset/) and `weight`, e.g. {dataset: pystdlib, weight: 0.5}"
            )
        preset = CONF_DIR / "dataset" / f"{entry['dataset']}.yaml"
        choices = sorted(p.stem for p in preset.parent.glob("*.yaml") if p.stem != MIXTURE)
        if entry["dataset"] == MIXTURE or not preset.exists():
            fail(f"{where}.dataset", f"{entry['dataset']} is not a source; choose one of {', '.join(choices)}")
        if "tokenizer" in entry or "mixture" in entry:
            key = "tokenizer" if "tokenizer" in entry else "mixture"
            fail(f"{where}.{key}", f"set by the run (dataset.{key}), not per source")
        own = {k: v for k, v in entry.items() if k not in MIXTURE_ENTRY_KEYS}
        values = OmegaConf.load(preset)
        values.pop("defaults", None)  # the preset's first default: its source's class (dataset_schema)
        schema = dataset_schema(values.get("source"))
        fields = {f.name for f in dataclasses.fields(schema)}
        lent = {k: getattr(d, k) for k in MIXTURE_INHERITED if k in fields}
        try:
            node = OmegaConf.merge(schema_node(schema), values, lent, {"tokenizer": d.tokenizer}, own)
            source = OmegaConf.to_object(node)
        except OmegaConfBaseException as e:
            raise ConfigError(one_line(e).replace("config: ", f"config: {where}.", 1)) from None
        sources.append((source.name, entry["weight"], source))
    return sources


def check_mixture(d: DatasetConfig, finetuning: bool) -> None:
    """source=mixture: text sources with positive weights and distinct names, each valid on its own."""
    if d.source != MIXTURE:
        return
    if len(d.mixture) < 1:
        fail(
            "dataset.mixture",
            "source=mixture needs at least one source, e.g. dataset.mixture=[{dataset: pystdlib, weight: 1}]",
        )
    if d.records or finetuning:
        fail("dataset.mixture", "mixes pretraining text; fine-tune on one prompt/completion source")
    defaults = type(d)()
    for key in MIXTURE_PER_SOURCE:
        if getattr(d, key) != getattr(defaults, key):
            fail(
                f"dataset.{key}",
                f"each source of a mixture holds out its own share: set it in the source's entry, e.g. "
                f"dataset.mixture=[{{dataset: pystdlib, weight: 1, {key}: {getattr(d, key)}}}]",
            )
    names, sources = [], mixture_sources(d)
    for i, (name, weight, source) in enumerate(sources):
        at = f"dataset.mixture[{i}]"
        for key in MIXTURE_RUN_WIDE:
            if key in d.mixture[i] and d.mixture[i][key] != getattr(d, key):
                fail(
                    f"{at}.{key}",
                    f"every source's rows are cut the run's way (one context, one masking, one vocabulary): set "
                    f"dataset.{key} for the run, not per source",
                )
        if not _positive_number(weight):
            fail(f"{at}.weight", f"must be a number > 0; got {weight!r}")
        if source.notes or source.records:
            fail(
                f"{at}.dataset",
                "a mixture mixes text for next-token pretraining; "
                f"{source.source}{' records' if source.records else ''} cannot be mixed",
            )
        if name in names:
            fail(f"{at}.name", f"{name!r} names two sources; give each a name of its own")
        names.append(name)
        source.check(at)
    weights = [w for _, w, _ in sources]
    if not math.isfinite(sum(weights)):  # 1e308 twice: their sum overflowed, and the draw crashed after the data loaded
        fail("dataset.mixture", f"the weights' sum {sum(weights)} is not a finite number; give smaller weights")
    if min(allot(weights, MIXTURE_BLOCK)) == 0:
        fail(
            "dataset.mixture",
            f"a weight below 1/{MIXTURE_BLOCK} of the total draws no row; raise it or drop that source",
        )


def _positive_number(weight: Any) -> bool:
    return not isinstance(weight, bool) and isinstance(weight, (int, float)) and weight > 0
