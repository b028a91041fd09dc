"""The web config file of Prometheus' exporter-toolkit (`--web.config.file` of node_exporter), as far as dltop
serves it: TLS (`tls_server_config`) and basic auth (`basic_auth_users`, bcrypt hashes). A key dltop does not
implement is an error naming it, never a setting silently left out (an auth rule ignored is an open door)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dltop.errors import DltopError

TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


@dataclass
class WebConfig:
    """What a web config file asks for: a TLS context (None: plain HTTP) and the users allowed in (empty: all)."""

    path: str
    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    _good: set[tuple[str, bytes]] = field(default_factory=set)  # (user, sha256 of a password bcrypt accepted)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def allows(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header gets in. bcrypt is slow by design (tens of ms): a password it
        accepted once is remembered by its SHA-256, as exporter-toolkit caches, so a scrape every second does
        not pay it again."""
        if not self.users:
            return True
        user, password = _basic(authorization)
        hashed = self.users.get(user or "")
        if user is None or password is None or hashed is None:
            return False
        digest = hashlib.sha256(password).digest()
        with self._lock:
            if any(u == user and hmac.compare_digest(d, digest) for u, d in self._good):
                return True
        import bcrypt

        try:
            ok = bcrypt.checkpw(password, hashed)
        except ValueError:  # a malformed hash was refused at load; nothing else raises here
            return False
        if ok:
            with self._lock:
                self._good.add((user, digest))
        return ok


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
    try:
        import yaml
    except ImportError:
        raise DltopError(f"--web-config {path}: reading it needs PyYAML (pip install 'dltop[export]')") from None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DltopError(f"--web-config {path}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise DltopError(f"--web-config {path}: not YAML: {str(e).splitlines()[0]}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise DltopError(f"--web-config {path}: expected a mapping at the top")
    unknown = sorted(set(data) - {"tls_server_config", "basic_auth_users"})
    if unknown:
        raise DltopError(f"--web-config {path}: {unknown[0]!r} is not supported by dltop export "
                         "(it serves tls_server_config and basic_auth_users)")
    cfg = WebConfig(path=path)
    if data.get("tls_server_config") is not None:
        cfg.tls = _tls(path, data["tls_server_config"], Path(path).parent)
    users = data.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise DltopError(f"--web-config {path}: basic_auth_users: expected a mapping of user: bcrypt hash")
    if users:
        try:
            import bcrypt
        except ImportError:
            raise DltopError(f"--web-config {path}: basic_auth_users needs bcrypt (pip install 'dltop[export]')"
                             ) from None
        for user, hashed in users.items():
            raw = str(hashed).encode()
            try:
                bcrypt.checkpw(b"", raw)
            except ValueError:
                raise DltopError(f"--web-config {path}: basic_auth_users: {user!r}: not a bcrypt hash") from None
            cfg.users[str(user)] = raw
    return cfg


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
    for key, attr in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        if key in tls:
            if tls[key] not in TLS_VERSIONS:
                raise DltopError(f"{where}: {key}: {tls[key]!r} is not one of {', '.join(TLS_VERSIONS)}")
            setattr(ctx, attr, TLS_VERSIONS[tls[key]])
    try:
        ctx.load_cert_chain(rel("cert_file"), rel("key_file"))
    except (OSError, ssl.SSLError) as e:
        raise DltopError(f"{where}: cannot load cert_file/key_file: {getattr(e, 'strerror', None) or e}") from None
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth not in CLIENT_AUTH:
        raise DltopError(f"{where}: client_auth_type: {auth!r} is not one of {', '.join(CLIENT_AUTH)}")
    ctx.verify_mode = CLIENT_AUTH[auth]
    if "client_ca_file" in tls:
        try:
            ctx.load_verify_locations(rel("client_ca_file"))
        except (OSError, ssl.SSLError) as e:
            raise DltopError(f"{where}: cannot load client_ca_file: {getattr(e, 'strerror', None) or e}") from None
    elif auth != "NoClientCert":
        raise DltopError(f"{where}: client_auth_type {auth} needs client_ca_file")
    return ctx
