"""Settings from the TOML config file ($XDG_CONFIG_HOME/dltop/config.toml) with command-line options on top."""

from __future__ import annotations

import os
import re
import tomllib
import urllib.parse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dltop.errors import DltopError
from dltop.trusted import open_trusted, read_trusted

DEFAULT_REFRESH_S = 1.0
MIN_REFRESH_S = 0.1
MAX_REFRESH_S = 60.0
MAX_JUMP_S = 366 * 86400.0  # a year: further is no step through a recording, and keeps time arithmetic finite
MAX_CONFIG_BYTES = 1 << 20  # a config is a few lines; a bigger file is not one
KNOWN_KEYS = frozenset({"refresh", "datasets", "read_only", "servers", "caches", "jump", "prometheus", "tab",
                        "mute"})  # later features add theirs here
# The TUI's tabs by name, in tab order (the panes' PANE_ID; a test checks they agree): `--tab`, `tab = "..."`.
TAB_NAMES = ("gpu", "pagecache", "datasets", "cpu", "training", "caches", "cluster")  # cluster: with a Prometheus
HINT_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
MAX_MUTED = 200  # hint ids in `mute = [...]`: there are a few dozen rules


@dataclass(frozen=True)
class PrometheusOptions:
    """Where the cluster view reads the cluster from (docs/cluster.md), with the credentials Prometheus' own clients
    take: basic auth with a password file, a bearer token file, a CA file, or TLS checks skipped."""

    url: str
    selector: str = ""  # label matchers put in every query (`job="dltop",cluster="a"`), checked (sources.cluster)
    username: str | None = None
    password_file: str | None = None
    bearer_token_file: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    timeout_s: float = 10.0


@dataclass(frozen=True)
class Settings:
    """Everything the sources, the Sampler and the TUI are configured with."""

    refresh_s: float = DEFAULT_REFRESH_S
    root: str = "/"
    pid: int | None = None
    datasets: tuple[str, ...] = ()
    read_only: bool = False
    servers: tuple[str, ...] = ()  # inference servers' /metrics URLs, normalized (server_url)
    caches: tuple[str, ...] = ()  # cache folders the user adds to the known ones (docs/caches.md)
    config_path: str | None = None
    jump_s: float = 60.0  # how far j / J move in time (live history and replay)
    prometheus: PrometheusOptions | None = None  # the Cluster tab's Prometheus; None: no Cluster tab
    tab: str | None = None  # the tab to open on (TAB_NAMES); None: the one that has something
    mute: tuple[str, ...] = ()  # hint ids never shown on the hint line (still listed in ?)
    user: int | None = None  # --user: the probes (jobs) of this uid only; None: all dltop may read (root: everyone's)
    discover: bool = True  # find the datasets training jobs read (--no-discover: off; docs/datasets.md)


def default_config_path() -> Path:
    """$XDG_CONFIG_HOME/dltop/config.toml, or ~/.config/dltop/config.toml."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "dltop" / "config.toml"


def load_config(path: str | os.PathLike[str] | None) -> Settings:
    """Read the config file; a missing default file is fine, a missing named file or bad TOML is an error."""
    p = Path(path) if path is not None else default_config_path()
    try:
        text = _config_text(p)
    except FileNotFoundError:
        if path is not None:
            raise DltopError(f"config file not found: {p}") from None
        return Settings()
    return _settings_from_toml(_parse_toml(text, p), str(p))


def _config_text(p: Path) -> str:
    """The text of a config file that is there; DltopError says why it cannot be read."""
    try:
        with open_trusted(p, "config file") as f:  # owner and mode as ssh checks its own (docs/trust.md)
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise DltopError(f"config file {p} is over {MAX_CONFIG_BYTES:,} bytes: not a config file")
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DltopError(f"cannot read config file {p}: not UTF-8 (byte {e.start:,})") from None
    except FileNotFoundError:
        raise
    except OSError as e:
        raise DltopError(f"cannot read config file {p}: {e.strerror or e}") from None


def _parse_toml(text: str, p: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DltopError(f"config file {p} is not valid TOML: {e}") from None
    except RecursionError:
        raise DltopError(f"config file {p} is not valid TOML: nested too deeply") from None
    except ValueError as e:  # tomllib's int() of an integer over Python's 4,300-digit limit
        raise DltopError(f"config file {p} is not valid TOML: {str(e).split(';')[0]}") from None


def _settings_from_toml(data: dict[str, Any], where: str) -> Settings:
    s = Settings(config_path=where)
    refresh = data.get("refresh", s.refresh_s)
    if isinstance(refresh, bool) or not isinstance(refresh, int | float):
        raise DltopError(f"{where}: refresh must be a number of seconds")
    _check_refresh(refresh, where)  # before float(): 10**400 has no float
    datasets = _str_list(data, "datasets", "paths", where)
    _no_nul(datasets, "datasets", where)
    read_only = data.get("read_only", False)
    if not isinstance(read_only, bool):
        raise DltopError(f"{where}: read_only must be true or false")
    servers = _str_list(data, "servers", "URLs", where)
    caches = _str_list(data, "caches", "paths", where)
    _no_nul(caches, "caches", where)
    jump = data.get("jump", s.jump_s)
    if isinstance(jump, bool) or not isinstance(jump, int | float) or not 0 < jump <= MAX_JUMP_S:
        raise DltopError(f"{where}: jump must be a number of seconds above 0, at most {MAX_JUMP_S:.0f} (a year)")
    prometheus = _prometheus_table(data.get("prometheus"), where)
    tab = data.get("tab")
    if tab is not None:
        tab = tab_name(tab, where)
    mute = _mute_list(data, where)
    unknown = sorted(set(data) - KNOWN_KEYS)
    if unknown:
        # A typo ("readonly = true") must not quietly leave actions enabled.
        raise DltopError(f"{where}: unknown setting {unknown[0]!r} (known: {', '.join(sorted(KNOWN_KEYS))})")
    return replace(s, refresh_s=_check_refresh(float(refresh), where),
                   datasets=tuple(os.path.abspath(os.path.expanduser(d)) for d in datasets), read_only=read_only,
                   servers=_server_urls(servers, where), caches=_cache_paths(caches), jump_s=float(jump),
                   prometheus=prometheus, tab=tab, mute=tuple(dict.fromkeys(mute)))


def _mute_list(data: dict[str, Any], where: str) -> list[str]:
    mute = data.get("mute", [])
    if (not isinstance(mute, list) or len(mute) > MAX_MUTED
            or not all(isinstance(m, str) and HINT_ID.fullmatch(m) for m in mute)):
        raise DltopError(f"{where}: mute must be a list of at most {MAX_MUTED} hint ids (as ? lists them: "
                         "letters, digits and '-')")
    return mute


def _str_list(data: dict[str, Any], key: str, what: str, where: str) -> list[str]:
    """A setting that is a list of strings (an empty one where it is not set)."""
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DltopError(f"{where}: {key} must be a list of {what}")
    return value


PROMETHEUS_KEYS: dict[str, type | tuple[type, ...]] = {
    "url": str, "selector": str, "username": str, "password_file": str, "bearer_token_file": str, "ca_file": str,
    "insecure_skip_verify": bool, "timeout": (int, float)}
_SECRET_KEYS = {"password": "password_file", "bearer_token": "bearer_token_file", "token": "bearer_token_file",
                "credentials": "bearer_token_file"}


def _prometheus_table(value: object, where: str) -> PrometheusOptions | None:
    """`prometheus = "URL"`, or a [prometheus] table with the URL, the selector and the credentials' file paths
    (as Prometheus' own scrape configs take them: password_file, bearer_token_file, ca_file); a secret written
    inline is refused, since a config file is read, copied and shared as plain text."""
    if value is None:
        return None
    if isinstance(value, str):
        return PrometheusOptions(_prometheus_url(value, where))
    if not isinstance(value, dict):
        raise DltopError(f"{where}: prometheus must be the URL of a Prometheus server, or a [prometheus] table")
    for key in value:
        _check_prometheus_key(key, value[key], where)
    if "url" not in value:
        raise DltopError(f"{where}: [prometheus] needs url = \"http://HOST:9090\"")
    _no_nul([v for v in value.values() if isinstance(v, str)], "[prometheus]", where)
    base = os.path.dirname(os.path.abspath(where))

    def path(key: str) -> str | None:
        # Relative to the config file's folder, as Prometheus reads the files its own config names.
        p = value.get(key)
        return None if p is None else os.path.join(base, os.path.expanduser(p))

    timeout = value.get("timeout", 10.0)
    if not 0.1 <= timeout <= 300:
        raise DltopError(f"{where}: [prometheus] timeout must be between 0.1 and 300 seconds")
    return PrometheusOptions(_prometheus_url(value["url"], where), selector=value.get("selector", ""),
                             username=value.get("username"), password_file=path("password_file"),
                             bearer_token_file=path("bearer_token_file"), ca_file=path("ca_file"),
                             insecure_skip_verify=value.get("insecure_skip_verify", False),
                             timeout_s=float(timeout))


def _check_prometheus_key(key: str, v: object, where: str) -> None:
    """A [prometheus] setting: a known one (never a secret written inline), of its type."""
    if key in _SECRET_KEYS:
        raise DltopError(f"{where}: [prometheus] {key}: no secrets in the config file: put it in a file only "
                         f"you can read and give {_SECRET_KEYS[key]} = \"PATH\"")
    if key not in PROMETHEUS_KEYS:
        raise DltopError(f"{where}: [prometheus]: unknown setting {key!r} (known: "
                         f"{', '.join(sorted(PROMETHEUS_KEYS))})")
    kind = PROMETHEUS_KEYS[key]
    if isinstance(v, bool) and kind is not bool or not isinstance(v, kind):
        raise DltopError(f"{where}: [prometheus] {key} must be "
                         + ("true or false" if kind is bool else "a number of seconds" if key == "timeout"
                            else "a string"))


def tab_name(value: object, where: str) -> str:
    """A tab named by the user (`--tab`, `tab = "..."`): one of TAB_NAMES, case and '-'/'_'/' ' ignored
    ("Page cache", "page-cache"); raises DltopError naming the known ones."""
    key = value.lower().replace("-", "").replace("_", "").replace(" ", "") if isinstance(value, str) else ""
    if key not in TAB_NAMES:
        shown = repr(value) if isinstance(value, str) else "not a string"
        raise DltopError(f"{where}: tab {shown[:60]} is not a tab (tabs: {', '.join(TAB_NAMES)})")
    return key


def _no_nul(paths: list[str], key: str, where: str) -> None:
    for p in paths:
        if "\0" in p:  # no file has one: os.stat would raise ValueError deep in a source
            raise DltopError(f"{where}: {key}: {p!r} holds a NUL character: not a path")  # repr: escaped


def _cache_paths(paths: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(os.path.abspath(os.path.expanduser(p)) for p in paths))


def _http_url(text: str, what: str) -> urllib.parse.SplitResult:
    """`text` as an http(s) URL (`http://` when no scheme is given) with a host and a numeric port, if any;
    raises ValueError naming what is wrong, `what` the kind of URL ("server", "Prometheus")."""
    given = text.strip()
    if "://" not in given:
        given = "http://" + given
    u = urllib.parse.urlsplit(given)
    if u.scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) URL: {text!r}")
    try:
        u.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        raise ValueError(f"bad port in {what} URL: {text!r}") from None
    if not u.hostname:
        raise ValueError(f"no host in {what} URL: {text!r}")
    return u


def server_url(text: str) -> str:
    """An inference server's /metrics URL from what a user typed: `host:port`, `http://host:port` (gets
    `/metrics`) or a full URL; raises ValueError naming what is wrong."""
    if not text.strip():
        raise ValueError("empty server URL")
    u = _http_url(text, "server")
    return urllib.parse.urlunsplit((u.scheme, u.netloc, u.path if u.path not in ("", "/") else "/metrics",
                                    u.query, ""))


def prometheus_url(text: str) -> str:
    """A Prometheus server's base URL from what a user typed (`host:9090`, `http://host:9090/prefix/`); raises
    ValueError naming what is wrong."""
    u = _http_url(text, "Prometheus")
    if u.query or u.fragment:
        raise ValueError(f"a Prometheus URL takes no query: {text!r}")
    if "@" in u.netloc:
        # The URL is shown on screen and in every error: a password in it would be too.
        raise ValueError("a Prometheus URL takes no user or password: give them as --prometheus-user and "
                         "--prometheus-password-file (or username and password_file in [prometheus])")
    return urllib.parse.urlunsplit((u.scheme, u.netloc, u.path.rstrip("/"), "", ""))


def _prometheus_url(text: str, where: str) -> str:
    try:
        return prometheus_url(text)
    except ValueError as e:
        raise DltopError(f"{where}: {e}") from None


def _server_urls(urls: list[str], where: str = "--server") -> tuple[str, ...]:
    out: list[str] = []
    for text in urls:
        try:
            url = server_url(text)
        except ValueError as e:
            raise DltopError(f"{where}: {e}") from None
        if url not in out:  # the same server twice would be scraped twice and shown twice
            out.append(url)
    return tuple(out)


def _check_refresh(value: float, where: str) -> float:
    if not MIN_REFRESH_S <= value <= MAX_REFRESH_S:  # NaN too: it compares false
        raise DltopError(f"{where}: refresh must be between {MIN_REFRESH_S} and {MAX_REFRESH_S} seconds")
    return value


def settings_from_args(args: Any) -> Settings:
    """Config file first, then the options given on the command line."""
    s = load_config(getattr(args, "config", None))
    changes = _options_given(args)
    if getattr(args, "prometheus", None) is not None or s.prometheus is not None:
        changes["prometheus"] = prometheus_options(args, s.prometheus)
    if getattr(args, "tab", None):
        changes["tab"] = tab_name(args.tab, "--tab")
    out = replace(s, **changes)
    if out.tab == "cluster" and out.prometheus is None:
        raise DltopError("tab cluster: the Cluster tab reads a Prometheus: give --prometheus URL (or prometheus = "
                         "\"URL\" in the config)")
    return out


def _options_given(args: Any) -> dict[str, Any]:
    """The settings the command line's options give (but the Prometheus ones and --tab), checked."""
    changes: dict[str, Any] = {f: getattr(args, a) for a, f in (("pid", "pid"), ("user", "user"), ("jump", "jump_s"))
                               if getattr(args, a, None) is not None}
    if getattr(args, "refresh", None) is not None:
        changes["refresh_s"] = _check_refresh(args.refresh, "--refresh")  # the CLI's parser checked it already
    for option, setting, checked in _CHECKED_OPTIONS:
        if getattr(args, option, None):
            changes[setting] = checked(getattr(args, option))
    if getattr(args, "read_only", False):
        changes["read_only"] = True
    if getattr(args, "no_discover", False):
        changes["discover"] = False
    return changes


def _proc_root(root: str) -> str:
    if not os.path.isdir(os.path.join(root, "proc")):
        raise DltopError(f"--root {root}: no proc/ directory under it")
    return root


def _dataset_paths(paths: list[str]) -> tuple[str, ...]:
    """The datasets given on the command line, each there; absolute, as the scans name them (the TUI matches rows,
    x and a by these paths)."""
    for p in paths:
        if not os.path.exists(p):
            raise DltopError(f"no such dataset path: {p}")
    return tuple(os.path.abspath(p) for p in paths)


# Options whose value is checked and made a setting: (option, setting, check), in the order they are checked.
_CHECKED_OPTIONS = (("root", "root", _proc_root), ("paths", "datasets", _dataset_paths),
                    ("servers", "servers", _server_urls), ("caches", "caches", _cache_paths))


def prometheus_options(args: Any, configured: PrometheusOptions | None = None) -> PrometheusOptions | None:
    """--prometheus URL and its credential options over the config's `prometheus`; the files must be readable
    now (a typo is one line at start, not a tab that says "unauthorized")."""
    url = getattr(args, "prometheus", None)
    if url is None and configured is None:
        return None
    opts = PrometheusOptions(_prometheus_url(url, "--prometheus")) if url is not None else configured
    assert opts is not None
    changes: dict[str, Any] = {}
    for name in ("selector", "username", "password_file", "bearer_token_file", "ca_file"):
        value = getattr(args, f"prometheus_{name}", None)
        if value is not None:
            changes[name] = value
    if getattr(args, "prometheus_insecure", False):
        changes["insecure_skip_verify"] = True
    timeout = getattr(args, "prometheus_timeout", None)
    if timeout is not None:
        if not 0.1 <= timeout <= 300:  # NaN too
            raise DltopError("--prometheus-timeout must be between 0.1 and 300 seconds")
        changes["timeout_s"] = float(timeout)
    opts = replace(opts, **changes)
    _check_credentials(opts)
    return opts


def _check_credentials(opts: PrometheusOptions) -> None:
    """One kind of credentials, and its files readable and trusted now (owner and mode too: a file another user
    can write is refused here, at start)."""
    if opts.password_file and not opts.username:
        raise DltopError("--prometheus-password-file needs --prometheus-user")
    if opts.username and opts.bearer_token_file:
        raise DltopError("--prometheus-user and --prometheus-bearer-token-file: one kind of credentials, not both")
    for what, path in (("--prometheus-password-file", opts.password_file),
                       ("--prometheus-bearer-token-file", opts.bearer_token_file),
                       ("--prometheus-ca-file", opts.ca_file)):
        if path is not None:
            try:
                read_trusted(path, what)
            except FileNotFoundError:
                raise DltopError(f"{what} {path}: cannot be read: no such file") from None
