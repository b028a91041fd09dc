"""Which folders are never a cache root (/, a system folder, a home, a Python prefix, or one that holds a home or
a prefix): the rule a clear refuses by (dltop.actions.confine) and the caches source walks by, one rule for both
(docs/trust.md)."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import stat
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dltop.fmt import printable

# Folders of the system itself: never a cache root (a cache lives below one of the writable ones).
SYSTEM_FOLDERS = frozenset({
    "/", "/bin", "/boot", "/dev", "/dev/shm", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
    "/mnt", "/nix", "/gnu", "/opt", "/proc", "/run", "/run/shm", "/run/user", "/sbin", "/snap", "/srv", "/sys",
    "/tmp", "/usr", "/usr/bin", "/usr/include", "/usr/lib", "/usr/lib64", "/usr/libexec", "/usr/local",
    "/usr/local/bin", "/usr/local/lib", "/usr/sbin", "/usr/share", "/usr/src", "/usr/tmp", "/var", "/var/cache",
    "/var/lib", "/var/local", "/var/log", "/var/mail", "/var/opt", "/var/spool", "/var/tmp", "/var/www",
    "/lost+found",
})
# Trees no tool puts a user's cache in: nothing below them is a cache root (the temp folders among them are
# the exception: /usr/tmp is a tempfile candidate, /dev/shm a tmpfs users write).
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys",
                "/usr")
WRITABLE_IN_TREES = ("/usr/tmp", "/dev/shm")


@dataclass(frozen=True)
class Refusal:
    """Why a path may not be cleared: the rule (a short key, for --json's `refused_by`) and the sentence."""

    rule: str  # "system folder", "home", "python prefix", "ancestor", "foreign content", ...
    reason: str


def _under(path: str, folder: str) -> bool:
    return folder == "/" or path.startswith(folder.rstrip("/") + "/")


# -- homes and Python prefixes ------------------------------------------------------------------------------


def homes(extra: Iterable[str] = ()) -> dict[str, str]:
    """{home folder: whose} of every passwd entry, dltop's own home and `extra` (the resolved environment's)."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for p in pwd.getpwall():
            if p.pw_dir and p.pw_dir != "/":
                out.setdefault(os.path.normpath(p.pw_dir), p.pw_name)
    for h in (os.path.expanduser("~"), *extra):
        if h and h != "/":
            out.setdefault(os.path.normpath(h), "the environment's $HOME")
    return out


def known_prefixes(env: Mapping[str, str] = {}) -> dict[str, str]:  # noqa: B006 (read only)
    """{Python prefix: which}: this interpreter's (sys.prefix, sys.base_prefix, ...) and the environment's
    VIRTUAL_ENV and CONDA_PREFIX."""
    out: dict[str, str] = {}
    for name in ("prefix", "base_prefix", "exec_prefix", "base_exec_prefix"):
        value = getattr(sys, name, "")
        if value:
            out.setdefault(os.path.normpath(value), f"sys.{name}")
    for name in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        value = env.get(name)
        if value and os.path.isabs(value):
            out.setdefault(os.path.normpath(value), f"${name}")
    return out


def prefix_marker(path: str) -> str | None:
    """What makes the folder `path` a Python prefix: 'pyvenv.cfg', 'conda-meta', 'lib/python3.11/site-packages';
    None when nothing does. Looked at without following a symlink at `path` itself."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return None
    except OSError:
        return None
    for marker in ("pyvenv.cfg", "conda-meta"):
        if os.path.lexists(os.path.join(path, marker)):
            return marker
    for lib in ("lib", "lib64"):
        for found in sorted(glob.glob(os.path.join(glob.escape(path), lib, "python[0-9]*", "site-packages"))):
            return os.path.relpath(found, path)
    return None


# -- the rules a cache root must pass -----------------------------------------------------------------------


def root_refusal(path: str, *, home_of: Mapping[str, str], prefixes: Mapping[str, str]) -> Refusal | None:
    """The first rule that refuses `path` as a cache root (as written and as resolved), or None."""
    shown = printable(path)
    for p in dict.fromkeys((os.path.normpath(path), os.path.realpath(path))):
        resolved = p != os.path.normpath(path)
        seen = printable(p) if resolved else shown
        via = f" ({shown} resolves to it)" if resolved else ""
        why = _is_refused(p, seen, via, home_of, prefixes)
        if why is None:
            why = _holds_refused(p, seen, via, home_of, prefixes)
        if why is not None:
            return why
    return None


def _is_refused(p: str, seen: str, via: str, home_of: Mapping[str, str],
                prefixes: Mapping[str, str]) -> Refusal | None:
    """`p` is a home, a system folder (or inside one) or a Python prefix."""
    if p in home_of:
        return Refusal("home", f"{seen} is a home folder (of {printable(home_of[p])}), not a cache{via}")
    if p in SYSTEM_FOLDERS:
        return Refusal("system folder", f"{seen} is a system folder, not a cache{via}")
    tree = _system_tree(p)
    if tree is not None:
        return Refusal("system folder", f"{seen} is inside {tree}, a system folder{via}")
    if p in prefixes:
        return Refusal("python prefix", f"{seen} is a Python prefix ({prefixes[p]}){via}")
    marker = prefix_marker(p)
    if marker is not None:
        return Refusal("python prefix", f"{seen} is a Python prefix ({marker}){via}")
    return None


def _system_tree(p: str) -> str | None:
    """The system tree `p` lies in, None where it lies in none or in a place of one that users write to."""
    if any(p == w or _under(p, w) for w in WRITABLE_IN_TREES):
        return None
    return next((t for t in SYSTEM_TREES if _under(p, t)), None)


def _holds_refused(p: str, seen: str, via: str, home_of: Mapping[str, str],
                   prefixes: Mapping[str, str]) -> Refusal | None:
    """`p` is an ancestor of a home or a Python prefix."""
    home = next((h for h in sorted(home_of) if _under(h, p)), None)
    if home is not None:
        return Refusal("ancestor", f"{seen} holds the home folder {printable(home)} (of "
                                   f"{printable(home_of[home])}){via}")
    prefix = next((x for x in sorted(prefixes) if _under(x, p)), None)
    if prefix is not None:
        return Refusal("ancestor", f"{seen} holds the Python prefix {printable(prefix)} ({prefixes[prefix]}){via}")
    return None
