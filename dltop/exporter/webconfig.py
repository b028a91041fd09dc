"""The web config file of Prometheus' exporter-toolkit (`--web.config.file` of node_exporter), as far as dltop
serves it: TLS (`tls_server_config`) and basic auth (`basic_auth_users`, bcrypt hashes). A key dltop does not
implement is an error naming it, never a setting silently left out (an auth rule ignored is an open door)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import os
import re
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dltop.errors import DltopError
from dltop.trusted import open_trusted, read_trusted

TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


MAX_WEB_CONFIG_BYTES = 1 << 20  # a few lines of YAML
AUTH_CACHE_SIZE = 100  # checks remembered, as exporter-toolkit's cache: right ones and wrong ones alike


@dataclass
class WebConfig:
    """What a web config file asks for: a TLS context (None: plain HTTP) and the users allowed in (empty: all)."""

    path: str
    tls: ssl.SSLContext | None = None
    files: tuple[str, ...] = ()  # the file and those it names (certificate, key, client CA): watched for changes
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    # What an unknown user is checked against: a hash of a random password at the users' cost, so that a 401 for
    # a name that does not exist costs the same bcrypt as one for a wrong password (names not told by timing).
    dummy_hash: bytes = b""
    # (keyed digest of user, hash, password) -> bcrypt's answer, oldest first. The key is random per process, so
    # a memory dump holds nothing to guess passwords against faster than bcrypt.
    _seen: OrderedDict[bytes, bool] = field(default_factory=OrderedDict)
    _key: bytes = field(default_factory=lambda: os.urandom(32))
    _lock: threading.Lock = field(default_factory=threading.Lock)  # guards _seen
    _bcrypt: threading.Lock = field(default_factory=threading.Lock)  # one bcrypt at a time: at most one core

    def allows(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header gets in. bcrypt is slow by design (tens of ms), so its answer for
        the same user and password is remembered, as exporter-toolkit does: a scrape every second does not pay it
        again, nor a scraper left with an old password; bcrypt runs one check at a time."""
        if not self.users:
            return True
        user, password = _basic(authorization)
        if user is None or password is None:
            return False  # nothing that names a user: no check that could tell one
        known = user in self.users
        hashed = self.users[user] if known else self.dummy_hash
        name = user.encode()
        digest = hmac.new(self._key, b"%d:%s%d:%s%s" % (len(name), name, len(hashed), hashed, password),
                          hashlib.sha256).digest()  # lengths first: no two triples read alike
        ok = self._recall(digest)
        if ok is None:
            with self._bcrypt:
                ok = self._recall(digest)  # a request with the same header may have checked it while this waited
                if ok is None:
                    ok = _checkpw(password, hashed)
                    self._remember(digest, ok)
        return ok and known

    def _recall(self, digest: bytes) -> bool | None:
        # Every entry is compared, in constant time, so how long a miss takes says nothing about what is held.
        found: bytes | None = None
        with self._lock:
            for d in self._seen:
                if hmac.compare_digest(d, digest):
                    found = d
            if found is None:
                return None
            self._seen.move_to_end(found)
            return self._seen[found]

    def _remember(self, digest: bytes, ok: bool) -> None:
        with self._lock:
            self._seen[digest] = ok
            while len(self._seen) > AUTH_CACHE_SIZE:
                self._seen.popitem(last=False)


def _checkpw(password: bytes, hashed: bytes) -> bool:
    import bcrypt

    try:
        return bool(bcrypt.checkpw(password, hashed))
    except ValueError:  # a password over bcrypt's 72 bytes (bcrypt 5 refuses it); hashes were checked at load
        return False


def bcrypt_cost(hashed: bytes) -> int | None:
    """The cost (log2 rounds) a bcrypt hash was made with: `$2b$12$...` -> 12; None if it is not one."""
    m = re.fullmatch(rb"\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}", hashed)
    return int(m.group(1)) if m else None


def _basic(authorization: str | None) -> tuple[str | None, bytes | None]:
    if not authorization or not authorization.startswith("Basic "):
        return None, None
    try:
        raw = base64.b64decode(authorization[6:].strip(), validate=True)
    except (binascii.Error, ValueError):
        return None, None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None, None
    return user.decode("utf-8", "replace"), password


def load_web_config(path: str) -> WebConfig:
    """Read and check a web config file; every problem is a DltopError naming the file and the key."""
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise DltopError(f"--web-config {path}: expected a mapping at the top")
    unknown = sorted(set(data) - {"tls_server_config", "basic_auth_users"})
    if unknown:
        raise DltopError(f"--web-config {path}: {unknown[0]!r} is not supported by dltop export "
                         "(it serves tls_server_config and basic_auth_users)")
    cfg = WebConfig(path=path, files=(path,))
    if data.get("tls_server_config") is not None:
        cfg.tls = _tls(path, data["tls_server_config"], Path(path).parent)
        tls = data["tls_server_config"]
        cfg.files += tuple(str(Path(path).parent / str(tls[k])) for k in ("cert_file", "key_file", "client_ca_file")
                           if k in tls)
    users = data.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise DltopError(f"--web-config {path}: basic_auth_users: expected a mapping of user: bcrypt hash")
    if users:
        _add_users(cfg, users)
    return cfg


def _read_yaml(path: str) -> Any:
    """The web config's YAML (an empty file is an empty mapping)."""
    try:
        import yaml
    except ImportError:
        raise DltopError(f"--web-config {path}: reading it needs PyYAML (pip install 'dltop[export]')") from None
    try:  # owner and mode as ssh checks its own: a file another user can change is refused (docs/trust.md)
        text = read_trusted(path, "--web-config", MAX_WEB_CONFIG_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DltopError(f"--web-config {path}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise DltopError(f"--web-config {path}: not YAML: {str(e).splitlines()[0]}") from None
    return {} if data is None else data


def _add_users(cfg: WebConfig, users: dict[Any, Any]) -> None:
    """basic_auth_users: each a bcrypt hash, checked; a dummy hash of the highest cost for names not there (a
    name that does not exist never answers faster than one that does)."""
    try:
        import bcrypt
    except ImportError:
        raise DltopError(f"--web-config {cfg.path}: basic_auth_users needs bcrypt (pip install 'dltop[export]')"
                         ) from None
    costs = []
    for user, hashed in users.items():
        raw = str(hashed).encode()
        cost = bcrypt_cost(raw)
        try:
            if cost is None:
                raise ValueError(raw)
            bcrypt.checkpw(b"", raw)
        except ValueError:
            raise DltopError(f"--web-config {cfg.path}: basic_auth_users: {user!r}: not a bcrypt hash") from None
        cfg.users[str(user)] = raw
        costs.append(cost)
    cfg.dummy_hash = bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(rounds=max(costs)))


def _tls(path: str, tls: Any, base: Path) -> ssl.SSLContext:
    where = f"--web-config {path}: tls_server_config"
    if not isinstance(tls, dict):
        raise DltopError(f"{where}: expected a mapping")
    unknown = sorted(set(tls) - TLS_KEYS)
    if unknown:
        raise DltopError(f"{where}: {unknown[0]!r} is not supported by dltop export (it knows {', '.join(sorted(TLS_KEYS))})")
    if not tls.get("cert_file") or not tls.get("key_file"):
        raise DltopError(f"{where}: needs cert_file and key_file")

    def rel(name: str) -> str:
        return str(base / str(tls[name]))  # relative to the config file, as exporter-toolkit reads them

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # exporter-toolkit's default
    _set_versions(ctx, tls, where)
    try:
        # Each file opened once, trusted as ssh trusts its own, and loaded from that very open file.
        with _trusted(rel("cert_file"), f"{where}: cert_file") as cert, \
                _trusted(rel("key_file"), f"{where}: key_file") as key:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise DltopError(f"{where}: cannot load cert_file/key_file: {getattr(e, 'strerror', None) or e}") from None
    _set_client_auth(ctx, tls, where, rel)
    return ctx


def _set_client_auth(ctx: ssl.SSLContext, tls: dict[str, Any], where: str, rel: Callable[[str], str]) -> None:
    """Whether clients must show a certificate, and the CA file that signs theirs."""
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth not in CLIENT_AUTH:
        raise DltopError(f"{where}: client_auth_type: {auth!r} is not one of {', '.join(CLIENT_AUTH)}")
    ctx.verify_mode = CLIENT_AUTH[auth]
    if "client_ca_file" in tls:
        try:  # a trust anchor: whoever can write it can let in any client
            with _trusted(rel("client_ca_file"), f"{where}: client_ca_file") as ca:
                ctx.load_verify_locations(ca)
        except (OSError, ssl.SSLError) as e:
            raise DltopError(f"{where}: cannot load client_ca_file: {getattr(e, 'strerror', None) or e}") from None
    elif auth != "NoClientCert":
        raise DltopError(f"{where}: client_auth_type {auth} needs client_ca_file")


def _set_versions(ctx: ssl.SSLContext, tls: dict[str, Any], where: str) -> None:
    for key, attr in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        if key in tls:
            if tls[key] not in TLS_VERSIONS:
                raise DltopError(f"{where}: {key}: {tls[key]!r} is not one of {', '.join(TLS_VERSIONS)}")
            setattr(ctx, attr, TLS_VERSIONS[tls[key]])


@contextlib.contextmanager
def _trusted(path: str, what: str) -> Iterator[str]:
    """A path to `path` opened by open_trusted: /proc/self/fd/N of the checked open file (ssl reads only paths),
    so what is loaded is what was checked."""
    with open_trusted(path, what) as f:  # a missing file raises FileNotFoundError: "cannot load ..." above
        fd_path = f"/proc/self/fd/{f.fileno()}"
        yield fd_path if os.path.exists(fd_path) else path


RELOAD_CHECK_S = 1.0  # how often, at most, the files are looked at again (a stat each, on a request's thread)


def _signature(files: tuple[str, ...]) -> tuple[tuple[int, int, int] | None, ...]:
    out: list[tuple[int, int, int] | None] = []
    for f in files:
        try:
            st = os.stat(f)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


class WebConfigWatcher:
    """A web config that follows its files, as exporter-toolkit re-reads its own: when the file, its certificate,
    key or client CA changes (mtime, size or inode: a rotation by rename too), it is read again, checked at most
    once a second. A new file that does not load keeps the config in use, with one line saying why."""

    def __init__(self, cfg: WebConfig, log: Callable[[str], None], check_s: float = RELOAD_CHECK_S) -> None:
        self._cfg = cfg
        self._log = log
        self._check_s = check_s
        self._seen = _signature(cfg.files)
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        self.reloads = 0  # how many times a changed file was read again and taken

    def current(self) -> WebConfig:
        """The config to serve this connection with."""
        with self._lock:
            now = time.monotonic()
            if now - self._checked < self._check_s:
                return self._cfg
            self._checked = now
            seen = _signature(self._cfg.files)
            if seen == self._seen:
                return self._cfg
            self._seen = seen  # a bad file is said once, not once a second
            try:
                new = load_web_config(self._cfg.path)
            except DltopError as e:
                self._log(f"dltop export: {e}; serving with the config read before")
                return self._cfg
            self._cfg, self._seen = new, _signature(new.files)
            self.reloads += 1
            self._log(f"dltop export: --web-config {self._cfg.path}: read again (it changed)")
            return new
