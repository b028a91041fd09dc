"""The optional C modules' machinery: built where a compiler is, loaded only at the API this dltop expects, and
switched off by DLTOP_NATIVE=0 (each module's own tests compare it with its Python twin)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from dltop import native

ROOT = Path(__file__).resolve().parent.parent


def _builder():
    spec = importlib.util.spec_from_file_location("dltop_build_native_t", ROOT / "scripts" / "build_native.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MODULE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *twice(PyObject *self, PyObject *arg) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLong(2 * v);
}
static PyMethodDef methods[] = {{"twice", twice, METH_O, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_NAME", NULL, -1, methods};
PyMODINIT_FUNC PyInit__NAME(void) {
    PyObject *m = PyModule_Create(&def);
    if (m) PyModule_AddIntConstant(m, "API", 7);
    return m;
}
"""


def test_a_module_is_built_rebuilt_when_its_source_changes_and_imported(tmp_path: Path) -> None:
    b = _builder()
    if b.compiler() is None or b.headers() is None:
        pytest.skip("no C compiler or Python headers here: nothing to build")
    (tmp_path / "_t1.c").write_text(MODULE.replace("_NAME", "_t1"))
    (tmp_path / "_bad.c").write_text("this is not C\n")
    said: list[str] = []
    built = b.build(tmp_path, log=said.append)
    assert [p.name for p in built] == [b.target(tmp_path / "_t1.c").name]
    assert any("_bad not built" in m for m in said), said
    sys.path.insert(0, str(tmp_path))
    try:
        spec = importlib.util.spec_from_file_location("_t1", built[0])
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert mod.twice(21) == 42 and mod.API == 7
    finally:
        sys.path.remove(str(tmp_path))
    # up to date: not compiled again
    said.clear()
    assert b.build(tmp_path, log=said.append) == built and not any("built" in m and "_t1" in m for m in said)
    assert not list(tmp_path.glob("*.tmp"))


def test_without_a_compiler_nothing_is_built_and_it_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = _builder()
    (tmp_path / "_t2.c").write_text(MODULE.replace("_NAME", "_t2"))
    monkeypatch.setattr(b, "compiler", lambda: None)
    said: list[str] = []
    assert b.build(tmp_path, log=said.append) == []
    assert said == ["dltop native modules not built: no C compiler (cc); dltop uses its Python loops "
                    "(docs/development.md)"]


def test_load_honours_dltop_native_0_and_the_api_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "EXPECTED", {"_nosuch": 1})
    native.reset()
    try:
        assert native.load("_nosuch") is None
        assert native.status()["_nosuch"].startswith("not built")
        native.reset()
        monkeypatch.setenv("DLTOP_NATIVE", "0")
        assert native.load("_nosuch") is None and native.status() == {"_nosuch": "off (DLTOP_NATIVE=0)"}
    finally:
        native.reset()


def test_dltop_version_says_which_loops_run_in_c_and_why_not() -> None:
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DLTOP_NATIVE", None)
    on = subprocess.run([sys.executable, "-m", "dltop", "--version"], capture_output=True, text=True, env=env,
                        timeout=60)
    off = subprocess.run([sys.executable, "-m", "dltop", "--version"], capture_output=True, text=True,
                         env={**env, "DLTOP_NATIVE": "0"}, timeout=60)
    assert on.returncode == off.returncode == 0 and on.stderr == off.stderr == ""
    head, *lines = on.stdout.splitlines()
    assert head.startswith("dltop ") and off.stdout.splitlines()[0] == head
    assert [ln.split(":")[0].strip() for ln in lines] == [native.ROLE[n] for n in native.EXPECTED]
    native.reset()
    try:
        want = native.lines()  # this process's view: C where built, else why not
    finally:
        native.reset()
    assert [ln.strip() for ln in lines] == want
    assert [ln.strip() for ln in off.stdout.splitlines()[1:]] == [
        f"{native.ROLE[n]}: off (DLTOP_NATIVE=0)" for n in native.EXPECTED]
