"""Dependencies point one way (docs/architecture.md, "Who may import whom"): every import of every module under
dltop/, read with ast (a lazy import inside a function counts as much as one at the top), against the table."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "dltop"

# What each part of dltop may import of dltop itself. A part is the first component under dltop/ ("sources",
# "tui", "fmt", ...), except the panes, which are held to a stricter rule than the rest of the TUI.
ALLOWED: dict[str, set[str]] = {
    "__init__": set(),
    "errors": set(),
    "fmt": set(),
    "kernel": {"errors"},
    # One file of /proc or /sys read as a hostile tree needs (bounded, no FIFO): stdlib only, below every reader.
    "procfs": set(),
    # Config and secret files trusted as sshd and sudo trust theirs (owner and mode): the config, the Prometheus
    # credentials and the exporter's web config all open theirs here.
    "trusted": {"errors"},
    # Which folders are never a cache root: the rule a clear refuses by (actions/confine) and the caches source
    # walks by.
    "cache_roots": {"fmt"},
    "native": {"native"},  # the optional C modules and their loader: below everything that uses them
    "cpuregs": {"errors"},
    "config": {"errors", "trusted"},
    # KV-cache arithmetic from a model config: pure, below the commands.
    "kv": {"errors", "fmt"},
    "model": {"model"},
    "text": {"text", "model", "fmt", "cpuregs"},
    "derive": {"model", "fmt"},  # fmt.printable: a note that quotes a server's URL
    # Each part's numbers described once (name, kind, unit, help, labels): the exporter and `dump` read them.
    "fields": {"model", "derive"},
    # The exporter serves what it is handed: fields' samples and hints' rules over Snapshots; it never samples.
    # (__init__: the version, for dltop_build_info; fmt: label values from outside escaped by the one sanitiser.)
    "exporter": {"exporter", "model", "fields", "hints", "errors", "fmt", "trusted", "__init__"},
    "hints": {"hints", "model", "fmt"},
    # The probes source shares the file format's constants and directory with the probe (dltop/probe/files.py).
    # The residency engine (walk, measure, scan, watch, budget): below the Datasets source and the page-cache
    # actions, which both use it.
    "residency": {"residency", "model", "fmt", "kernel", "errors", "native", "procfs"},
    "sources": {"sources", "model", "fmt", "kernel", "errors", "config", "cpuregs", "probe", "kv", "native",
                "residency", "procfs", "trusted", "cache_roots", "__init__"},
    "sampler": {"model", "sources", "derive", "procfs"},
    # Time over the Snapshots (the live history, a recording's feed): UI-free, below the TUI and the commands.
    "timeline": {"model"},
    # Where the screen is in time (Live | Paused | Replay): a value over the timeline's times.
    "playhead": {"timeline"},
    # What a pane is handed on each tick (View): below the Session and the TUI.
    "view": {"model", "hints"},
    # The TUI's state without widgets (history, hints, the playhead, the action gate, view()): above the layers
    # it reads and the runner it asks, below the TUI; `recorder` only for a typed time (recorder.times).
    "session": {"model", "hints", "config", "errors", "timeline", "playhead", "view", "recorder", "tabs",
                "watchlist"},
    # The Session's parts that need no Session: the tab to open on, and the edits of what is watched.
    "tabs": {"model", "config"},
    "watchlist": {"config"},
    "actions": {"actions", "model", "fmt", "kernel", "errors", "sources", "residency", "journal", "native",
                "procfs", "cache_roots"},
    # The machine's action journal: the runner appends, recorders tail it.
    "journal": {"journal"},
    # The flight recorder: below the commands and the TUI's starter, never the TUI itself.
    "recorder": {"recorder", "model", "sources", "sampler", "derive", "hints", "config", "errors", "fmt", "fields",
                 "text", "journal", "native", "procfs", "__init__"},
    # The app (not its panes) owns the action runner: the one place the TUI's actions run.
    "tui": {"tui", "model", "fmt", "text", "derive", "hints", "config", "errors", "actions", "recorder",
            "journal", "timeline", "playhead", "view", "session", "__init__"},
    "tui/panes": {"tui", "model", "fmt", "text", "derive", "hints", "view"},
    "commands": {"commands", "model", "fmt", "text", "errors", "config", "cpuregs", "kernel", "sources",
                 "sampler", "actions", "hints", "derive", "fields", "exporter", "tui", "kv", "recorder",
                 "timeline", "residency", "journal", "__init__"},
    "cli": {"commands", "errors", "native", "__init__"},  # native: --version says which loops run in C
    "__main__": {"cli"},
    # The in-process probe runs inside training scripts: nothing of dltop's but itself, and the kernel's ctypes
    # wrappers (stdlib only, imported when an epoch closes: cachestat of the job's data).
    "probe": {"probe", "kernel", "autoprobe"},
    # Zero-code mode's start (the .pth): imports nothing until torch is imported, then the probe's hooks.
    "autoprobe": {"probe"},
}
# Third-party packages only some parts may import.
ONLY_IN = {"textual": {"tui"}, "rich": {"tui"}}
# Only the command that starts the TUI may import it.
TUI_IMPORTERS = {"dltop/commands/tui.py"}
# Within tui/, only the app may import actions, and only the runner.
# The GPU tab's environment view reads one process's /proc/PID/environ when `e` is pressed: a look that changes
# nothing (no runner, no journal), checked by the process's start time as a signal is.
ACTIONS_IN_TUI = {"dltop/tui/app.py": {"dltop.actions.runner"},
                  "dltop/tui/screens/environ.py": {"dltop.actions.environ"}}
# Within tui/, only the app reads a typed time ("10m ago", "14:05"), and nothing else of the recorder: a replay's
# recording is handed in by commands/replay.py.
RECORDER_IN_TUI = {"dltop/tui/app.py": {"dltop.recorder.times"}}
MODULE_NAME = re.compile(r"dltop(\.[a-z_][a-z0-9_]*)+(:[A-Za-z_][A-Za-z0-9_]*)?")


def _part(path: Path) -> str:
    rel = path.relative_to(PKG)
    if rel.parts[:2] == ("tui", "panes"):
        return "tui/panes"
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = ["dltop", *path.relative_to(PKG).with_suffix("").parts]
    if here[-1] == "__init__":
        here.pop()
    out = []
    for node in ast.walk(tree):
        # A module named in a string is imported somewhere (registries: PANE_SPECS, COMMANDS, importlib calls):
        # it counts as an import of the module that names it.
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.fullmatch(node.value):
            out.append((node.lineno, node.value.partition(":")[0]))
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + (1 if path.name == "__init__.py" else 0)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            if mod != "dltop":
                out.append((node.lineno, mod))
                continue
            # `from dltop import sources` imports dltop.sources; `from dltop import __version__`, dltop itself
            for a in node.names:
                sub = (PKG / a.name).is_dir() or (PKG / f"{a.name}.py").is_file()
                out.append((node.lineno, f"dltop.{a.name}" if sub else "dltop"))
    return out


# The probe's framework callbacks import their framework (and only theirs): never from `import dltop.probe`,
# only when a script imports the callback's module (tests/test_probe_frameworks.py checks the first part).
FRAMEWORK_CALLBACKS = {"dltop/probe/hf.py": ("transformers",),
                       "dltop/probe/lightning.py": ("lightning", "pytorch_lightning")}


def _violations(path: Path) -> list[str]:
    part = _part(path)
    allowed = ALLOWED.get(part)
    rel = path.relative_to(PKG.parent).as_posix()
    if allowed is None:
        return [f"{rel}: dltop/{part} has no row in the import table (add it to docs/architecture.md and here)"]
    bad = []
    for line, mod in _imports(path):
        top = mod.split(".")[0]
        if top == "dltop":
            target = mod.split(".")[1] if "." in mod else "__init__"
            if target == "tui" and part not in ("tui", "tui/panes") and rel not in TUI_IMPORTERS:
                bad.append(f"{rel}:{line} imports {mod} (only commands/tui.py starts the TUI)")
            elif target == "actions" and part == "tui" and mod not in ACTIONS_IN_TUI.get(rel, set()):
                bad.append(f"{rel}:{line} imports {mod}: in tui/, only app.py holds the runner (dltop.actions.runner)")
            elif target == "recorder" and part == "tui" and mod not in RECORDER_IN_TUI.get(rel, set()):
                bad.append(f"{rel}:{line} imports {mod}: in tui/, only app.py reads times (dltop.recorder.times)")
            elif target not in allowed and target != part.split("/")[0]:
                bad.append(f"{rel}:{line} imports {mod}: dltop/{part} may import only {sorted(allowed)}")
        elif top in ONLY_IN and part.split("/")[0] not in ONLY_IN[top]:
            bad.append(f"{rel}:{line} imports {mod}: only {sorted(ONLY_IN[top])} may import {top}")
        elif part == "probe" and top not in sys.stdlib_module_names and top not in ("torch", "dltop") \
                and top not in FRAMEWORK_CALLBACKS.get(rel, ()):
            bad.append(f"{rel}:{line} imports {mod}: the probe imports the standard library only (and torch lazily)")
    return bad


MODULES = sorted(PKG.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PKG).as_posix())
def test_imports_follow_the_table(path: Path) -> None:
    assert _violations(path) == []


def test_the_checker_catches_what_it_should(tmp_path: Path) -> None:
    # The rule has teeth: a pane that imports a source or an action, a hint that imports actions, and Textual
    # outside tui/ are each reported.
    fake = tmp_path / "dltop"
    for rel, code in {
        "tui/panes/bad.py": "from dltop.sources.datasets import scan_paths\nimport dltop.actions.pagecache\n",
        "hints/bad.py": "def f():\n    from dltop.actions import pagecache\n",
        "sources/bad.py": "import textual\nfrom ..actions import runner\n",
        "model/bad.py": "from dltop.sources import memory\n",
        # A registry naming a module by string, and the TUI's app importing an action module itself
        "tui/panes/__init__.py": 'SPECS = ("dltop.tui.panes.x:XPane", "dltop.sources.memory:read")\n',
        "hints/reg.py": 'import importlib\nimportlib.import_module("dltop.actions.pagecache")\n',
        "tui/app.py": "from dltop.actions.runner import ActionRunner\nfrom dltop.actions import pagecache\n",
        "tui/other.py": "from dltop.actions.runner import ActionRunner\n",
    }.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(code)
    global PKG
    saved, PKG = PKG, fake
    try:
        found = {p.relative_to(fake).as_posix(): _violations(p) for p in fake.rglob("*.py")}
    finally:
        PKG = saved
    assert len(found["tui/panes/bad.py"]) == 2
    assert len(found["hints/bad.py"]) == 1 and "dltop.actions" in found["hints/bad.py"][0]
    assert len(found["sources/bad.py"]) == 2 and any("imports dltop.actions" in v for v in found["sources/bad.py"])
    assert len(found["model/bad.py"]) == 1
    assert [v for v in found["tui/panes/__init__.py"] if "dltop.sources.memory" in v] and len(
        found["tui/panes/__init__.py"]) == 1
    assert len(found["hints/reg.py"]) == 1 and "dltop.actions.pagecache" in found["hints/reg.py"][0]
    assert len(found["tui/app.py"]) == 1 and found["tui/app.py"][0].startswith("dltop/tui/app.py:2 ")
    assert len(found["tui/other.py"]) == 1


# --- no module takes another module's private names; no import circles --------------------------------------------


def _module_name(path: Path, pkg: Path) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _bindings(path: Path, pkg: Path, modules: set[str]) -> list[tuple[int, str, str | None, str]]:
    """(line, module, name, bound as) of every import in the file, relative ones resolved: `import M` and a
    `from P import name` whose name is a module come as (M, None); `from M import name` as (M, name)."""
    here = _module_name(path, pkg)
    out: list[tuple[int, str, str | None, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, None, a.asname or a.name.partition(".")[0]) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = here.split(".")
                base = base[: len(base) - node.level + (1 if path.name == "__init__.py" else 0)]
                mod = ".".join([*base, mod] if mod else base)
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.append((node.lineno, sub, None, a.asname or a.name) if sub in modules
                           else (node.lineno, mod, a.name, a.asname or a.name))
    return out


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` as text, or None when it is not a plain dotted name."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_uses(path: Path, pkg: Path) -> list[tuple[int, str]]:
    """(line, `module._name`) of each private name of another dltop module that this file takes: `from M import
    _x`, or `m._x` where `m` is an imported dltop module (`import dltop.m as m`, `from dltop import m`)."""
    modules = {_module_name(p, pkg) for p in pkg.rglob("*.py")}
    here = _module_name(path, pkg)
    out: set[tuple[int, str]] = set()
    bound: dict[str, str] = {}  # a local name -> the dltop module it names
    for line, mod, name, local in _bindings(path, pkg, modules):
        if not mod.startswith("dltop"):
            continue
        if name is None:
            bound[local] = mod if local != "dltop" else "dltop"
        elif _is_private(name) and mod != here:
            out.add((line, f"{mod}.{name}"))
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            target = _dotted(node.value)
            if target is None:
                continue
            head, _, rest = target.partition(".")
            module = bound.get(head)
            if module is None:
                continue
            full = f"{module}.{rest}" if rest and module == "dltop" else (module if not rest else f"{module}.{rest}")
            if full in modules and full != here:
                out.add((node.lineno, f"{full}.{node.attr}"))
    return sorted(out)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PKG).as_posix())
def test_no_module_takes_another_modules_private_names(path: Path) -> None:
    rel = path.relative_to(PKG.parent).as_posix()
    assert [f"{rel}:{line} uses {name}" for line, name in _private_uses(path, PKG)] == []


def _circles(pkg: Path) -> list[set[str]]:
    """The import circles among dltop's modules (an import inside a function counts): each strongly connected
    set of more than one module."""
    paths = {_module_name(p, pkg): p for p in pkg.rglob("*.py")}
    modules = set(paths)
    graph = {m: {mod for _l, mod, _n, _b in _bindings(p, pkg, modules) if mod in modules and mod != m}
             for m, p in paths.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(group)

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return found


def test_no_import_circles() -> None:
    assert [sorted(c) for c in _circles(PKG)] == []


def test_the_private_and_circle_checks_catch_what_they_should(tmp_path: Path) -> None:
    fake = tmp_path / "dltop"
    for rel, code in {
        "__init__.py": "",
        "a/__init__.py": "",
        "a/engine.py": "_Acc = 1\n_x = 2\ndef f():\n    return _x\n",
        "a/user.py": "from dltop.a.engine import _Acc\nfrom dltop.a import engine\nimport dltop.a.engine as e\n"
                     "import dltop.a.engine\n"
                     "x = engine._x\ny = e._x\nz = dltop.a.engine._x + len(engine.__name__)\n",
        "a/fine.py": "from dltop.a.engine import f\nclass C:\n    _y = 1\n    def g(self):\n        return self._y\n",
        "b/__init__.py": "",
        "b/one.py": "def f():\n    from dltop.b import two\n",
        "b/two.py": "from dltop.b.one import f\n",
    }.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(code)
    uses = _private_uses(fake / "a" / "user.py", fake)
    assert uses == [(1, "dltop.a.engine._Acc"), (5, "dltop.a.engine._x"), (6, "dltop.a.engine._x"),
                    (7, "dltop.a.engine._x")]
    assert _private_uses(fake / "a" / "fine.py", fake) == [] and _private_uses(fake / "a" / "engine.py", fake) == []
    assert _circles(fake) == [{"dltop.b.one", "dltop.b.two"}]
