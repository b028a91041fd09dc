"""The README and docs/*.md as a user reads them: every relative link resolves (the file, and a #heading in
it), every `dltop` command line the README shows is one dltop takes (a real subcommand, real options, values
its parser accepts), and the README's key tables hold every key of every tab."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from dltop import cli

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SHELL_STOP = {"&", "&&", "|", "||", ";", ">", ">>", "<", "2>"}  # another command or a redirect follows


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _prose(text: str) -> str:
    return FENCE.sub("", text)


def dead_links(files: list[Path]) -> list[str]:
    """'FILE: TARGET: why' for each relative link in files that leads nowhere."""
    out = []
    for f in files:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(f.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto: ...: not this repository's
            path, _, fragment = target.partition("#")
            dest = (f.parent / path).resolve() if path else f
            if not dest.exists():
                out.append(f"{f.name}: {target}: no such file")
            elif fragment and dest.suffix == ".md":
                headings = {_slug(h) for h in re.findall(r"^#+ (.*)$", _prose(dest.read_text()), re.M)}
                if fragment not in headings:
                    out.append(f"{f.name}: {target}: no heading #{fragment} in {dest.name}")
    return out


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    assert len(DOCS) > 10
    assert dead_links(DOCS) == []


def test_a_dead_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n\n## The GPU tab\n\n[ok](#the-gpu-tab) [ok](b.md)\n")
    (tmp_path / "b.md").write_text("[gone](c.md) [no heading](a.md#the-cpu-tab) [fine](a.md#top)\n"
                                   "```\n[in code](nowhere.md)\n```\n")
    assert dead_links([tmp_path / "a.md", tmp_path / "b.md"]) == [
        "b.md: c.md: no such file", "b.md: a.md#the-cpu-tab: no heading #the-cpu-tab in a.md"]


def _argv(line: str) -> list[str] | None:
    """The arguments after `dltop` (or scripts/dltop, .venv/bin/dltop) in a shell line, up to a pipe or a
    redirect; None where the line runs no dltop."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    for i, word in enumerate(words):
        if word == "dltop" or word.endswith("/dltop"):
            rest = words[i + 1:]
            stop = next((j for j, w in enumerate(rest) if w in SHELL_STOP or w.startswith(">")), len(rest))
            return rest[:stop]
    return None


def readme_commands(text: str) -> tuple[list[list[str]], list[list[str]]]:
    """(whole command lines from the README's shell blocks and `$ ` lines, fragments from its inline code)."""
    whole = []
    for lang, body in FENCE.findall(text):
        for line in body.splitlines():
            if lang == "sh" or line.startswith("$ "):
                argv = _argv(line.removeprefix("$ "))
                if argv is not None:
                    whole.append(argv)
    spans = re.findall(r"`([^`\n]+)`", _prose(text))
    fragments = [argv for span in spans if (argv := _argv(span)) is not None]
    return whole, fragments


def command_problem(argv: list[str], whole: bool) -> str | None:
    """Why `dltop ARGV` is not a command dltop takes, or None. A fragment (inline code, which may leave out a
    required option) has its subcommand and option names checked; a whole line is parsed as dltop does."""
    args = cli._command_first(list(argv))
    first = args[0] if args else None
    tui, cmd, sub = cli.build_parser(first if first in cli.COMMANDS else None)
    parser = sub.choices[first] if first in cli.COMMANDS else tui
    if first not in cli.COMMANDS and first is not None and re.fullmatch(r"[a-z][a-z-]*", first):
        return f"{first!r}: no such subcommand"  # a dataset PATH has a / in it
    for word in args[1 if first in cli.COMMANDS else 0:]:
        option = word.split("=", 1)[0]
        if option.startswith("-") and option != "-" and option not in parser._option_string_actions:
            return f"{option}: no such option of {parser.prog}"
    if not whole or "--help" in args or any(w.isupper() for w in args):  # CMD, PATH: placeholders
        return None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            (cmd if first in cli.COMMANDS else tui).parse_args(args)
    except SystemExit:
        return err.getvalue().strip() or "refused"
    return None


def test_every_dltop_command_in_the_readme_is_one_dltop_takes() -> None:
    whole, fragments = readme_commands((REPO / "README.md").read_text())
    assert len(whole) >= 25 and len(fragments) >= 10, (len(whole), len(fragments))
    lines = [*((a, True) for a in whole), *((a, False) for a in fragments)]
    problems = [f"dltop {shlex.join(a)}: {p}" for a, w in lines if (p := command_problem(a, w)) is not None]
    assert problems == []


@pytest.mark.parametrize(("line", "why"), [
    ("dltop residency /data --fils", "--fils: no such option of dltop residency"),
    ("dltop resdency /data", "'resdency': no such subcommand"),
    ("dltop residency /data --sort bigness", "invalid choice"),
    ("dltop --tab gpus", "not a tab"),
])
def test_a_command_dltop_does_not_take_is_found(line: str, why: str) -> None:
    argv = _argv(line)
    assert argv is not None
    problem = command_problem(argv, whole=True)
    assert problem is not None and why in problem, problem


KEY_NAMES = {"enter": "Enter", "backspace": "Backspace", "escape": "Esc", "home": "Home", "end": "End",
             "question_mark": "?", "slash": "/", "greater_than_sign": ">", "less_than_sign": "<", "plus": "+",
             "minus": "-", "ctrl+c": "Ctrl-C", "left": "←", "right": "→"}


def readme_key_tables(text: str) -> dict[str, set[str]]:
    """The README's Keys section: each tab's name (a bold line) -> the keys in its table's first column."""
    assert "\n## Keys\n" in text, "the README has no Keys section"
    section = text.split("\n## Keys\n", 1)[1].split("\n## ", 1)[0]
    tables: dict[str, set[str]] = {}
    names: list[str] = []
    for line in section.splitlines():
        if line.startswith("**"):
            names = re.findall(r"\*\*(.+?)\*\*", line)
            for name in names:
                tables.setdefault(name, set())
        elif line.startswith("| ") and names:
            cell = line.split("|")[1]
            keys = set(re.findall(r"`([^`]+)`", cell))
            keys |= set(re.findall(r"\b(Enter|Backspace|Esc|Home|End|Ctrl-C)\b", cell))
            for name in names:
                tables[name] |= keys
    return tables


def test_the_readme_has_a_key_table_for_every_tab_with_every_key_of_its_pane() -> None:
    from dltop.tui.app import DltopApp
    from dltop.tui.panes import pane_classes

    tables = readme_key_tables((REPO / "README.md").read_text())
    missing = []
    for pane in pane_classes(cluster=True):
        name = pane.TITLE
        assert any(n == name or n.startswith(name + " ") for n in tables), f"no key table for the {name} tab"
        keys = next(v for n, v in tables.items() if n == name or n.startswith(name + " "))
        for binding in pane.BINDINGS:
            if not any(KEY_NAMES.get(k, k) in keys for k in binding.key.split(",")):
                missing.append(f"{name}: {binding.key} ({binding.description})")
    for binding in DltopApp.BINDINGS:
        if not (binding.id or "").startswith("app.tab") and not any(
                KEY_NAMES.get(k, k) in tables["Everywhere"] for k in binding.key.split(",")):
            missing.append(f"Everywhere: {binding.key} ({binding.description})")
    assert missing == []
