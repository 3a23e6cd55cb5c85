"""The README is a newcomer's first page: short, its links lead somewhere, and every command in it (and in the guides
in docs/) runs as written. Nothing here trains: a `python train_jax.py ...` command's overrides are composed and
checked as the run would check them before it loads anything (`load_config`, every job of a `-m` sweep), a script
must exist and take the options the command gives it (`--help` names each), and a module must be importable.

A command is a logical line of a ```bash block (continuation lines joined, `# ...` comments dropped). In it,
`<name>` stands for a path the reader supplies (a run directory, say) and a bare `...` for more overrides of the
reader's: the first becomes a made-up path, the second is dropped; `$RANK` becomes 0. A command this file cannot
check is a failure until it is taught to check it, or named in SKIPPED with the reason.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import helpers
from core.errors import ConfigError
from training.cli.overrides import as_overrides
from training.config import load_config

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 250
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

# Commands that cannot be checked here, each with its reason (a substring of the command -> why). Empty today: every
# command of the README and the guides is checked.
SKIPPED: dict[str, str] = {}

PLACEHOLDER = re.compile(r"<[^<>\s]+>")
ENVIRONMENT = {"$RANK": "0"}
BASH_BLOCK = re.compile(r"^([ \t]*)```bash[ \t]*\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^[ \t]*```")
HYDRA_FLAGS = {"-m", "--multirun", "--help", "-h", "--cfg", "-c", "--resolve"}


def without_comment(line: str) -> str:
    """`line` up to a `#` that starts a word outside quotes, as bash reads a comment."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def commands(page: Path) -> list[tuple[str, str]]:
    """(page:line, command) for every command in `page`'s bash blocks."""
    text = page.read_text()
    found = []
    for block in BASH_BLOCK.finditer(text):
        first_line = text.count("\n", 0, block.start(2)) + 1
        pending, start = "", None
        for offset, raw in enumerate(block.group(2).splitlines()):
            line = without_comment(raw).strip()
            if not line and not pending:
                continue
            start = start if pending else first_line + offset
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            command = (pending + line).strip()
            pending = ""
            if command:
                found.append((f"{page.relative_to(ROOT)}:{start}", command))
    return found


ALL_COMMANDS = [c for page in PAGES for c in commands(page)]


def as_written(command: str) -> list[str]:
    """The command's words, placeholders filled in, the reader's `...` dropped, leading VAR=value assignments off."""
    words = [PLACEHOLDER.sub("placeholder", ENVIRONMENT.get(w, w)) for w in shlex.split(command) if w != "..."]
    words = [re.sub(r"\$[A-Z_]+", lambda m: ENVIRONMENT.get(m.group(0), m.group(0)), w) for w in words]
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words.pop(0)
    return words


def check_overrides(args: list[str], multirun: bool) -> int:
    """Compose `args` as train_jax.py would (every job of a sweep); the number of configs composed."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = as_overrides(args)
    jobs = [overrides]
    if multirun:
        parsed = OverridesParser.create().parse_overrides(overrides)
        jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    for job in jobs:
        load_config(job)
    return len(jobs)


def check_train_jax(args: list[str]) -> None:
    """Hydra's flags aside (`-m`, `--help`, `--cfg [job|hydra|all]`), the arguments are overrides."""
    rest = []
    for before, arg in zip([None, *args], args):
        if arg in HYDRA_FLAGS or (before in ("--cfg", "-c") and arg in ("job", "hydra", "all")):
            continue
        if arg.startswith("-"):
            pytest.fail(f"train_jax.py: {arg}: not a flag the command line takes")
        rest.append(arg)
    check_overrides(rest, multirun=any(a in ("-m", "--multirun") for a in args))


@functools.cache
def script_help(script: str) -> str:
    """`python -m <script> --help` (a tool in scripts/, by its module name) or `python <script> --help` (a file):
    train_jax.py's and the tools' from the worker's warm Python (helpers.run_cli), any other file's in a new one."""
    if script == "train_jax.py" or not script.endswith(".py"):
        module = "train_jax" if script == "train_jax.py" else script
        result = helpers.run_cli(["--help"], timeout=60, module=module)
    else:
        result = subprocess.run(
            [sys.executable, script, "--help"], check=False, cwd=ROOT, capture_output=True, text=True, timeout=60
        )
    assert result.returncode == 0, f"{script} --help exited {result.returncode}: {result.stderr[-2000:]}"
    return result.stdout


def check_python_script(script: str, args: list[str]) -> None:
    """A file's or a scripts/ module's options are among those its --help names."""
    if script.endswith(".py"):
        assert (ROOT / script).is_file(), f"{script}: no such file"
    if "--" in args:  # what follows a bare `--` goes to train_jax.py (scripts/experiments/schedule_search.py)
        args, overrides = args[: args.index("--")], args[args.index("--") + 1 :]
        check_overrides(overrides, multirun=False)
    options = {a.split("=", 1)[0] for a in args if a.startswith("-")}
    helped = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", script_help(script)))
    assert options <= helped, f"{script} does not take {sorted(options - helped)} (its --help names {sorted(helped)})"


ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def check(words: list[str]) -> None:
    while ASSIGNMENT.match(words[0]):  # `NAME=value command ...`: the variables the command runs with
        words = words[1:]
    program, args = words[0], words[1:]
    if program == "python":
        if args[0] == "train_jax.py":
            check_train_jax(args[1:])
        elif args[0] == "-c":
            compile(args[1], "<python -c>", "exec")
        elif args[0] == "-m" and args[1].startswith("scripts."):
            check_python_script(args[1], args[2:])
        elif args[0] == "-m":
            import importlib.util

            assert importlib.util.find_spec(args[1]) is not None, f"python -m {args[1]}: no such module"
        elif args[0].endswith(".py"):
            check_python_script(args[0], args[1:])
        else:
            pytest.fail(f"python {args[0]}: not a form this test knows")
    elif program == "bash":
        script = ROOT / args[0]
        assert script.is_file(), f"{args[0]}: no such file"
        result = subprocess.run(["bash", "-n", str(script)], check=False, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
    elif program == "pip" and args[:2] == ["install", "-r"]:
        assert (ROOT / args[2]).is_file(), f"{args[2]}: no such file"
    elif program == "pip" and args[0] == "download":  # requirement files of the checkout, into a folder (-d)
        files = [args[i + 1] for i, a in enumerate(args) if a == "-r"]
        assert files and "-d" in args, f"pip download {' '.join(args[1:])}: names no -r file or no -d folder"
        for file in files:
            assert (ROOT / file).is_file(), f"{file}: no such file"
    else:
        pytest.fail(f"{program}: a command this test cannot check; teach it, or name it in SKIPPED with a reason")


@pytest.mark.parametrize("where, command", ALL_COMMANDS, ids=[where for where, _ in ALL_COMMANDS])
def test_the_command_runs_as_written(where, command):
    reason = next((why for part, why in SKIPPED.items() if part in command), None)
    if reason:
        pytest.skip(reason)
    try:
        check(as_written(command))
    except ConfigError as e:
        pytest.fail(f"{where}: {command}\n  {e}")


def test_the_readme_shows_commands_and_every_skip_names_a_command():
    readme = [c for where, c in ALL_COMMANDS if where.startswith("README.md:")]
    assert len(readme) >= 10
    assert any(c.startswith("bash scripts/train_lm.sh") for c in readme)
    assert any(c.startswith("bash scripts/test.sh") for c in readme)
    for part in SKIPPED:
        assert any(part in c for _, c in ALL_COMMANDS), f"SKIPPED names no command any more: {part!r}"


def test_the_readme_is_a_first_page():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, _ and - kept), spaces -> -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen, fenced = set(), {}, False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*)", line)):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    """The targets of `page`'s links and images outside code blocks."""
    out, fenced = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_link_leads_to_a_file_and_heading_of_the_repository(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_the_readme_links_a_guide_for_each_topic():
    targets = {t.partition("#")[0] for t in links(README)}
    guides = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} - {"docs/decoders.md", "docs/mup_transfer.md"}
    assert guides <= targets, f"guides the README does not link: {sorted(guides - targets)}"
