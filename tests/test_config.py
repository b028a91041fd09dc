"""The config file is input from elsewhere: bad types, huge numbers, NaN, non-UTF-8 bytes, deep nesting, a huge
file. Each is a DltopError with one line naming the file and the key, and `dltop` exits 1 with that line on
stderr; a fuzz of mutated and generated files finds no other exception."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dltop.config import MAX_CONFIG_BYTES, load_config
from dltop.errors import DltopError

from .conftest import REPO

GOOD = ('refresh = 2.5\nread_only = true\njump = 30\ndatasets = ["/data/a", "~/b"]\n'
        'servers = ["localhost:8000"]\ncaches = ["/tmp/c"]\n')


def _one_line(text: str) -> bool:
    return "\n" not in text.strip() and not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text.strip())


@pytest.mark.parametrize("text, words", [
    ("refresh = nan\n", "refresh must be between"),
    ("refresh = inf\n", "refresh must be between"),
    ("refresh = 1e400\n", "refresh must be between"),
    ("refresh = 99999999999999999999999999999\n", "refresh must be between"),
    ("refresh = true\n", "refresh must be a number"),
    ('refresh = "1"\n', "refresh must be a number"),
    ("jump = nan\n", "jump must be a number of seconds above 0"),
    ("jump = inf\n", "jump must be a number of seconds above 0"),
    ("jump = -1\n", "jump must be a number of seconds above 0"),
    ("jump = 1e300\n", "at most"),
    ("jump = 1" + "0" * 5000 + "\n", "is not valid TOML: Exceeds the limit (4300 digits)"),
    ("datasets = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n", "nested too deeply"),
    ('datasets = ["/data/a\\u0000b"]\n', "holds a NUL character"),
    ('caches = ["/c\\u0000"]\n', "holds a NUL character"),
    ("datasets = [1, 2]\n", "datasets must be a list of paths"),
    ("read_only = 1\n", "read_only must be true or false"),
    ('servers = ["ftp://x"]\n', "not an http(s) URL"),
    ('servers = ["localhost:99999999999"]\n', "bad port"),
    ("refresh = [\n", "is not valid TOML"),
    ('datasets = ["\x1b]0;pwned\x07"]\nrefresh = \n', "is not valid TOML"),
], ids=lambda v: v[:24].strip())
def test_a_bad_config_is_one_line(tmp_path: Path, text: str, words: str) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    with pytest.raises(DltopError) as e:
        load_config(cfg)
    assert words in str(e.value) and str(cfg) in str(e.value) and _one_line(str(e.value)), str(e.value)


def test_bytes_that_are_not_utf8_say_where(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    data = b'refresh = 2\ndatasets = ["/data/caf\xe9"]\n'
    cfg.write_bytes(data)
    with pytest.raises(DltopError, match=rf"not UTF-8 \(byte {data.index(0xE9)}\)$"):
        load_config(cfg)


def test_a_huge_file_is_not_read_whole(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_bytes(b"# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    with pytest.raises(DltopError, match=f"over {MAX_CONFIG_BYTES:,} bytes"):
        load_config(cfg)


@pytest.mark.parametrize("content", [
    b"jump = 1" + b"0" * 5000 + b"\n",
    b"datasets = " + b"[" * 5000 + b"]" * 5000 + b"\n",
    b"refresh = 1e400\n",
    b"refresh = 2\xff\n",
], ids=["huge-int", "deep", "1e400", "not-utf8"])
def test_the_command_exits_1_with_one_line(tmp_path: Path, content: bytes) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "dltop", "snapshot", "--config", str(cfg)], capture_output=True,
                       text=True, cwd=REPO, timeout=60, env={**os.environ, "XDG_CONFIG_HOME": "/nonexistent"})
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert r.stderr.startswith("dltop: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


def _read(tmp: Path, data: bytes) -> None:
    cfg = tmp / "config.toml"
    cfg.write_bytes(data)
    try:
        load_config(cfg)
    except DltopError as e:
        assert _one_line(str(e)) and len(str(e)) < 600, str(e)


def test_fuzz_mutated_configs_never_raise(tmp_path: Path) -> None:
    good = GOOD.encode()
    load_config_ok = tmp_path / "ok.toml"
    load_config_ok.write_bytes(good)
    load_config(load_config_ok)  # the file mutated is a good one
    values = ["nan", "inf", "-inf", "1e400", "-1", "0", "true", '"x"', "[]", "{}", "1" + "0" * 5000,
              "[" * 2000 + "]" * 2000, '"\\u0000"', '["\\u0000"]', "0x7fffffffffffffffffff", "1979-05-27"]
    tried: list[int] = []

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(st.sampled_from(["truncate", "flip", "insert", "value"]), st.floats(0, 1, exclude_max=True),
           st.one_of(st.sampled_from(values).map(str.encode), st.binary(max_size=20)))
    def one(how: str, at: float, extra: bytes) -> None:
        tried.append(1)
        i = int(at * len(good))
        if how == "truncate":
            data = good[:i]
        elif how == "flip":
            data = good[:i] + bytes([good[i] ^ (1 << (i % 8))]) + good[i + 1:]
        elif how == "insert":
            data = good[:i] + extra + good[i:]
        else:  # a key's value swapped for a hostile one
            lines = good.split(b"\n")
            j = i * (len(lines) - 1) // len(good)
            lines[j] = lines[j].split(b"=")[0] + b"= " + extra
            data = b"\n".join(lines)
        _read(tmp_path, data)

    one()
    print(f"config: {len(tried)} mutated config files read")
    assert len(tried) >= 200


def test_fuzz_generated_configs_never_raise(tmp_path: Path) -> None:
    tried: list[int] = []
    keys = st.sampled_from(["refresh", "jump", "datasets", "servers", "caches", "read_only", "other"])
    scalars = st.one_of(st.booleans(), st.integers(), st.floats(), st.text(max_size=10))
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=6)

    def toml_value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == -float("inf") else repr(v))
        if isinstance(v, str):
            return '"' + "".join(c if c.isalnum() else f"\\u{ord(c):04x}" for c in v if ord(c) < 0x10000
                                 and not 0xD800 <= ord(c) < 0xE000) + '"'
        if isinstance(v, list):
            return "[" + ", ".join(toml_value(x) for x in v) + "]"
        return str(v)

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(st.dictionaries(keys, values, max_size=5))
    def one(table: dict[str, object]) -> None:
        tried.append(1)
        _read(tmp_path, "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items()).encode())

    one()
    print(f"config: {len(tried)} generated config files read")
    assert len(tried) >= 200
