"""EleutherAI's lm-evaluation-harness on the project's model: an adapter that answers lm-eval's three kinds of
request with the model and the run's own tokenizer, and `evaluate_tasks`, which runs lm-eval's tasks through it.

- log-likelihood (multiple choice, cloze): models/scoring.py, batched by padded length, context cut from the left;
- rolling log-likelihood (perplexity tasks): lm-eval's own windows (each token predicted once, every window as long
  as the model's context), scored the same way;
- generation: greedy, with the KV-cache decoder (models/decode.py), cut at the first `until` string.

lm-eval is an optional extra (requirements-eval.txt), imported when an adapter is made, never when this module is.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datasets.exceptions import DataFilesNotFoundError, DatasetNotFoundError

from core.errors import ConfigError, DataError, MissingPackageError, first_line, warn
from core.hub import hub_reachable, offline_hub
from models.decode import generate
from models.gpt import GPT
from models.scoring import DEFAULT_BATCH_TOKENS, continuation_logprobs, padded_rows

if TYPE_CHECKING:
    from lm_eval.api.model import LM

    from data.tokenizers import Tokenizer

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default when a task does not say


def import_lm_eval() -> types.ModuleType:
    """The lm_eval package, or one line saying how to install it."""
    try:
        import lm_eval
        import lm_eval.api.model  # noqa: F401
    except ImportError as e:
        raise MissingPackageError(f"lm-eval is not installed ({e}): pip install -r requirements-eval.txt") from None
    return lm_eval


class HarnessAnswers:
    """What lm-eval asks of a language model, answered by an Equinox GPT and a project tokenizer. Combined with
    lm-eval's TemplateLM by `harness_lm` (which encodes (context, continuation) pairs as lm-eval does for causal
    models: the whole text, split where the context's ids end; an empty context becomes <EOS>)."""

    def __init__(self, model: GPT, tokenizer: Tokenizer, batch_tokens: int = DEFAULT_BATCH_TOKENS) -> None:
        super().__init__()
        self.model, self.tokenizer, self.batch_tokens = model, tokenizer, batch_tokens
        self.max_length = model.cfg.context_size  # lm-eval's name for the model's context

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id  # <EOS> separates documents in training, so it is what precedes a text

    @property
    def tokenizer_name(self) -> str:
        return f"gpt-jax-{self.tokenizer.kind}-{self.tokenizer.fingerprint()}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.tokenizer.encode(string)

    def _loglikelihood_tokens(
        self, requests: list, disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        pairs = [(context, continuation) for _, context, continuation in requests]
        context_size = self.model.cfg.context_size
        if (longest := max((len(continuation) for _, continuation in pairs), default=0)) > context_size:
            raise DataError(  # lm-eval's own backends refuse it too: its tokens cannot all be scored at once
                f"lm-eval: a task's answer is {longest} tokens, more than the model's context of {context_size}: "
                "evaluate a model with a longer context, or leave out that task"
            )
        if any(not continuation for _, continuation in pairs):
            raise DataError("lm-eval: a task's answer is empty (no token to score); leave out that task")
        return continuation_logprobs(self.model, pairs, self.batch_tokens)

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        pairs, owner = [], []
        for index, (text,) in enumerate(request.args for request in requests):
            windows = get_rolling_token_windows(
                token_list=self.tokenizer.encode(text),
                prefix_token=self.eot_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for window in map(make_disjoint_window, windows):
                pairs.append(window)
                owner.append(index)
        totals = [0.0] * len(requests)
        for index, (logprob, _) in zip(owner, continuation_logprobs(self.model, pairs, self.batch_tokens)):
            totals[index] += logprob
        return totals

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

        groups: dict[str, list[int]] = {}  # requests with the same generation arguments decode together
        for index, request in enumerate(requests):
            groups.setdefault(json.dumps(request.args[1], sort_keys=True, default=str), []).append(index)
        answers = [""] * len(requests)
        rows = max(1, self.batch_tokens // self.max_length)
        for indices in groups.values():
            kwargs = normalize_gen_kwargs(dict(requests[indices[0]].args[1]), DEFAULT_MAX_GEN_TOKS)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=None)  # <EOS> stops by its id
            max_gen_toks = int(kwargs.pop("max_gen_toks"))
            if kwargs.get("do_sample"):
                warn(f"generation arguments {kwargs} ask for sampling; this adapter decodes greedily")
            # Room for every new token in the KV cache (lm-eval's rule for causal models), unless that leaves less
            # than half the context for the prompt; past the context the decoder slides its window.
            keep = max(self.max_length - max_gen_toks, self.max_length // 2)
            for start in range(0, len(indices), rows):
                chunk = indices[start : start + rows]
                prompts = [self._prompt(requests[i].args[0], keep) for i in chunk]
                prompts += [[self.eot_token_id]] * (padded_rows(len(prompts), rows) - len(prompts))
                outputs = generate(self.model, prompts, max_gen_toks, temperature=0.0, eos_id=self.eot_token_id)
                for i, ids in zip(chunk, outputs):
                    ids = ids[: ids.index(self.eot_token_id)] if self.eot_token_id in ids else ids
                    answers[i] = postprocess_generated_text(self.tokenizer.decode(ids), until, None)
        return answers

    def _prompt(self, context: str, keep: int) -> list[int]:
        return (self.tokenizer.encode(context) or [self.eot_token_id])[-keep:]


def harness_lm(model: GPT, tokenizer: Tokenizer, batch_tokens: int = DEFAULT_BATCH_TOKENS) -> LM:
    """An `lm_eval.api.model.LM` that answers with `model`, encoding and decoding with `tokenizer`."""
    template = import_lm_eval().api.model.TemplateLM
    return type("GptJaxLM", (HarnessAnswers, template), {})(model, tokenizer, batch_tokens)


def evaluate_tasks(
    lm: LM,
    tasks: list[str],
    *,
    include_path: str | None = None,
    limit: float | None = None,
    num_fewshot: int | None = None,
    seed: int = 0,
) -> dict:
    """lm-eval's results for `tasks` (its registered names, or those of task YAMLs under `include_path`)."""
    lm_eval = import_lm_eval()
    from lm_eval.tasks import TaskManager

    if include_path is not None and not Path(include_path).is_dir():
        raise ConfigError(f"--include-path: {include_path} is not a directory of task YAML files")
    # Indexing lm-eval's own thousands of task files took 28 s on a 2-core machine: skipped when local ones suffice.
    manager = TaskManager(include_path=include_path, include_defaults=False) if include_path else None
    if manager is None or not set(tasks) <= set(manager.all_tasks):
        manager = TaskManager(include_path=include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ConfigError(
            f"--tasks: {', '.join(unknown)} is not an lm-eval task or group (`lm-eval ls tasks` lists "
            "them; --include-path adds a folder of task YAMLs)"
        )
    if not hub_reachable():
        offline_hub()  # the tasks' data then comes from datasets' cache at once, instead of after ~25 s of retries
    try:
        return lm_eval.simple_evaluate(
            model=lm,
            tasks=tasks,
            task_manager=manager,
            limit=limit,
            num_fewshot=num_fewshot,
            log_samples=False,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    except (ConnectionError, DatasetNotFoundError, DataFilesNotFoundError) as e:
        raise DataError(
            f"--tasks: a task's data could not be loaded: {first_line(e)}. Offline? Run once online "
            "(datasets keeps it in its cache), or point --include-path at task YAMLs over local files"
        ) from None
