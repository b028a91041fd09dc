"""Files trusted as ssh and sudo trust theirs (docs/trust.md): the one check that every reader of a config or secret
file goes through (the config, the Prometheus credentials, the exporter's web config)."""

from __future__ import annotations

import errno
import os
import pwd
import stat
from typing import BinaryIO

from dltop.errors import DltopError

MAX_SECRET_BYTES = 64 << 10  # a password, a token, a key or a CA bundle; more is not one


def _owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


def _untrusted(st: os.stat_result, is_dir: bool) -> str | None:
    """Why a file or folder with this stat is not trusted by this process, or None: it must be owned by the user
    dltop runs as (its effective uid) or by root, and writable by no one else. A folder writable by others is
    trusted only with its sticky bit (/tmp): then no one else can rename or remove what it holds."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"is owned by {_owner(st.st_uid)}, not by you or root"
    if st.st_mode & 0o022 and not (is_dir and st.st_mode & stat.S_ISVTX):
        who = "group and others" if st.st_mode & 0o022 == 0o022 else "group" if st.st_mode & 0o020 else "others"
        return f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def open_trusted(path: str | os.PathLike[str], what: str) -> BinaryIO:
    """`path` opened for reading, if it is trusted the way sshd's StrictModes and sudo trust their files: a regular
    file (a symlink is not followed), owned by you (the effective uid) or root and writable by no one else, in
    folders up to / that pass the same rule (a sticky folder such as /tmp may be writable by all). Anything else
    raises DltopError with one line naming `what` ("config file", "--prometheus-password-file"), the file and why.
    Every reader of a config or secret file (the config, password, bearer token, CA and TLS key files, the
    exporter's web config) opens it here."""
    given = os.fspath(path)
    shown = given  # the CLI's writer escapes what it prints (docs/trust.md)
    # The folder's real path: the file is opened through folders that were checked, not through a link that could
    # point elsewhere by the time it is opened.
    folder = os.path.realpath(os.path.dirname(os.path.abspath(given)))
    full = os.path.join(folder, os.path.basename(given))
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise DltopError(f"{what} {shown}: is a symlink (to {os.path.realpath(full)}): refused, not "
                             "followed; give the file itself") from None
        if isinstance(e, FileNotFoundError):
            raise
        raise DltopError(f"{what} {shown}: cannot be read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        why = None if stat.S_ISREG(st.st_mode) else "is not a regular file"
        why = why or _untrusted(st, False) or _untrusted_folders(folder)
        if why is not None:
            raise DltopError(f"{what} {shown}: {why}: refused (a file another user can change is not read; "
                             "see docs/trust.md)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _untrusted_folders(folder: str) -> str | None:
    """Why `folder` or one above it, up to /, is not trusted (the first found from the file up), or None."""
    where = folder
    while True:
        try:
            why = _untrusted(os.lstat(where), True)
        except OSError as e:
            why = f"cannot be checked: {e.strerror or e}"
        if why is not None:
            return f"is in {where}, which {why}"
        if os.path.dirname(where) == where:
            return None
        where = os.path.dirname(where)


def read_trusted(path: str | os.PathLike[str], what: str, max_bytes: int = MAX_SECRET_BYTES) -> bytes:
    """The bytes of a trusted file (open_trusted), at most `max_bytes` (more raises DltopError)."""
    with open_trusted(path, what) as f:
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise DltopError(f"{what} {os.fspath(path)}: over {max_bytes:,} bytes: not read")
    return raw
