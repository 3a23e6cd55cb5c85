"""`python train_jax.py --help`: every config key with its type, default and meaning, read from the schema itself.

Types, defaults and choices (enums) come from the dataclasses of training/config/ by introspection. A key's meaning
is the comment its maintainers keep beside the field (`batch_size: int = 16  # sequences per ...`) together with the
comment lines directly above it, read with `tokenize` (comments are not in the AST) at the lines `ast` gives the
field. Hydra's help template (conf/hydra/help/gpt_jax.yaml) takes the text through the `config_help` resolver, with
the composed config, so `python train_jax.py model=gpt2 --help` also shows what that command changes.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import inspect
import io
import textwrap
import tokenize
import typing
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

WIDTH = 120
_ABSENT = object()


@dataclass
class Key:
    name: str  # dotted, as an override writes it
    type: str
    default: Any
    meaning: str


@functools.cache
def _source(path: str) -> tuple[ast.Module, dict[int, str], list[str]]:
    """The file's syntax tree, its comments by line (text after `#`), and its lines."""
    text = open(path, encoding="utf-8").read()
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    }
    return ast.parse(text), comments, text.splitlines()


def _source_file(cls: type) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except TypeError:  # made at run time (dataclasses.make_dataclass): no source
        return None


def _class_node(cls: type) -> ast.ClassDef | None:
    path = _source_file(cls)
    if path is None:
        return None
    tree, _, _ = _source(path)
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__), None)


def field_meanings(cls: type) -> dict[str, str]:
    """Each annotated field of `cls` and of the dataclasses it extends: the comment-only lines right above it, then
    its trailing comment, joined (a field added at run time, e.g. an optimizer's own hyper-parameter, has none)."""
    meanings: dict[str, str] = {}
    for base in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(base):
            meanings.update(field_meanings(base))
    return {**meanings, **_own_meanings(cls)}


def _own_meanings(cls: type) -> dict[str, str]:
    node = _class_node(cls)
    if node is None:
        return {}
    _, comments, lines = _source(_source_file(cls))

    def comment_only(row: int) -> bool:
        return row in comments and lines[row - 1].lstrip().startswith("#")

    meanings = {}
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        above, row = [], item.lineno - 1
        while comment_only(row):
            above.insert(0, comments[row])
            row -= 1
        rows = range(item.lineno, item.end_lineno + 1)
        trailing = [comments[r] for r in rows if r in comments and not comment_only(r)]
        meanings[item.target.id] = " ".join(above + trailing)
    return meanings


def type_name(t: Any) -> str:
    """A field's type as a user writes its value: `int`, `float or null`, `list[str]`, `a | b`, `any`."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if t is Any:
        return "any"
    if isinstance(t, type) and issubclass(t, enum.Enum):  # a choice: its values, as overrides spell them
        return " | ".join(str(member.value) for member in t)
    if origin is typing.Union:
        named = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (list, tuple, dict):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]" if args else origin.__name__
    return getattr(t, "__name__", str(t))


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "(required)"


def keys(schema: type, prefix: str = "", composed: DictConfig | None = None) -> list[tuple[str, str, list[Key]]]:
    """Sections in schema order: (dotted name, the dataclass's docstring, its keys); nested dataclasses follow their
    parent as sections of their own. A section whose class depends on its values (the dataset section: its
    source's, `schema_for`) is the class `composed` has there."""
    hints = typing.get_type_hints(schema)
    meanings = field_meanings(schema)
    node = next((n for n in map(_class_node, schema.__mro__) if n is not None), None)
    doc = (ast.get_docstring(node) or "") if node is not None else ""
    own, nested = [], []
    for f in dataclasses.fields(schema):
        t = hints[f.name]
        if hasattr(t, "schema_for"):
            t = t.schema_for(OmegaConf.select(composed, f"{prefix}{f.name}") if composed is not None else None)
        if dataclasses.is_dataclass(t):
            nested += keys(t, f"{prefix}{f.name}.", composed)
        else:
            own.append(Key(f"{prefix}{f.name}", type_name(t), _default(f), meanings.get(f.name, "")))
    return [(prefix.rstrip("."), doc, own), *nested]


def show(value: Any) -> str:
    """A value as an override would write it."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return str(value)


def help_text(schema: type, composed: DictConfig | None = None, width: int = WIDTH) -> str:
    """One entry per key, `key: type = default`, then `(here: value)` where `composed` (the config this command
    line composes) holds another value, then the key's meaning; grouped by section."""
    out = []
    for section, doc, section_keys in keys(schema, composed=composed):
        if not section_keys:
            continue
        title = f"{section or '(top level)'}:" + (f" {doc}" if doc else "")
        out += ["", *textwrap.wrap(title, width, subsequent_indent="  ")]
        for key in section_keys:
            line = f"{key.name}: {key.type} = {show(key.default)}"
            here = OmegaConf.select(composed, key.name, default=_ABSENT) if composed is not None else _ABSENT
            if here is not _ABSENT and show(here) != show(key.default):
                line += f" (here: {show(here)})"
            if key.meaning:
                line += f" -- {key.meaning}"
            out += textwrap.wrap(line, width, initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False)
    return "\n".join(out).lstrip("\n")


def _resolver(*, _root_: DictConfig) -> str:
    from training.config import Config

    return help_text(Config, _root_).replace("$", "$$")  # the text lands in a string.Template


OmegaConf.register_new_resolver("config_help", _resolver, replace=True)
