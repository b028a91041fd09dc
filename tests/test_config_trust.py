"""Config and secret files are trusted as ssh and sudo trust theirs (dltop.trusted.open_trusted, docs/trust.md):
owned by the user dltop runs as or root, writable by no one else, a regular file and no symlink, in folders that
pass the same rule. Root's `dltop cluster` with another user's config that names /etc/shadow as password_file
sends nothing to that user's listener; the good cases still work, as root and as a second user (setpriv)."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dltop.errors import DltopError
from dltop.exporter.webconfig import load_web_config
from dltop.trusted import open_trusted

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT or shutil.which("setpriv") is None,
                                reason="needs root (files of another user, setpriv)")
EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


class _Listener(http.server.BaseHTTPRequestHandler):
    got: list[str | None] = []  # noqa: RUF012 - the Authorization header of every request that came in

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(EMPTY)

    def do_GET(self) -> None:  # noqa: N802 - the label values API (the jobs that serve dltop's metrics)
        self._send(b'{"status":"success","data":[]}')

    def _send(self, body: bytes) -> None:
        self.got.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str | None]]]:
    _Listener.got = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Listener)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Listener.got
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def shared(reachable_dir: Path) -> Path:
    """A folder a second user can reach: /tmp/X (root's, 0755)."""
    return reachable_dir


def _cluster(config: Path, *user: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*user, sys.executable, "-m", "dltop", "cluster", "--config", str(config)],
                          capture_output=True, text=True, cwd="/", timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": "/nonexistent"})


def _as_nobody() -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def _config(path: Path, url: str, password_file: str | None = None, mode: int = 0o644, uid: int = 0) -> Path:
    extra = f'username = "root"\npassword_file = "{password_file}"\n' if password_file else ""
    path.write_text(f'[prometheus]\nurl = "{url}"\n{extra}')
    os.chown(path, uid, uid)
    path.chmod(mode)
    return path


def _refused(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr.count("\n") == 1 and "refused" in r.stderr and all(w in r.stderr for w in words), r.stderr


@needs_root
def test_another_users_world_writable_config_naming_shadow_is_refused(shared: Path, listener: tuple) -> None:
    url, got = listener
    cfg = _config(shared / "config.toml", url, password_file="/etc/shadow", mode=0o666, uid=NOBODY)
    _refused(_cluster(cfg), str(cfg), f"uid {NOBODY}")
    assert got == []  # nothing reached the listener: no /etc/shadow as basic auth
    # root's own file naming another user's password file: refused too, before anything is sent
    secret = shared / "pw"
    secret.write_text("theirs\n")
    os.chown(secret, NOBODY, NOBODY)
    _refused(_cluster(_config(shared / "root.toml", url, password_file=str(secret))), str(secret),
             "--prometheus-password-file")
    assert got == []


@needs_root
@pytest.mark.parametrize("case", ["root 0666", "root 0620", "folder 0777", "symlink", "fifo"])
def test_a_config_others_could_change_is_refused(shared: Path, listener: tuple, case: str) -> None:
    url, got = listener
    cfg = shared / "config.toml"
    if case.startswith("root"):
        _config(cfg, url, mode=int(case.split()[1], 8))
        words = ["writable by"]
    elif case == "folder 0777":
        folder = shared / "open"
        folder.mkdir()
        folder.chmod(0o777)  # no sticky bit: anyone can put another file in its place
        cfg = _config(folder / "config.toml", url)
        words = [f"is in {folder}, which is writable by"]
    elif case == "symlink":
        target = _config(shared / "real.toml", url)
        cfg.symlink_to(target)
        words = ["symlink"]
    else:
        os.mkfifo(cfg)
        words = ["not a regular file"]
    _refused(_cluster(cfg), *words)
    assert got == []


@needs_root
def test_good_configs_and_secrets_are_read(shared: Path, listener: tuple) -> None:
    url, got = listener
    secret = shared / "pw"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    r = _cluster(_config(shared / "config.toml", url, password_file=str(secret)))
    assert r.returncode == 0, r.stderr
    assert got and set(got) == {"Basic cm9vdDpzM2NyZXQ="}  # root:s3cret, in each query of the refresh
    # /tmp is writable by all, but sticky: what root keeps there is root's
    assert open_trusted(secret, "x").read() == b"s3cret\n"


@needs_root
def test_a_second_user_reads_their_own_config_and_roots(shared: Path, listener: tuple) -> None:
    url, got = listener
    home = shared / "nobody"
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY, NOBODY)
    secret = home / "pw"
    secret.write_text("mine\n")
    os.chown(secret, NOBODY, NOBODY)
    secret.chmod(0o600)
    own = _config(home / "config.toml", url, password_file=str(secret), mode=0o600, uid=NOBODY)
    r = _cluster(own, *_as_nobody())
    assert r.returncode == 0, r.stderr
    root_owned = _config(shared / "root.toml", url)  # root's, 0644: trusted by everyone
    r = _cluster(root_owned, *_as_nobody())
    assert r.returncode == 0, r.stderr
    assert got[0] == "Basic cm9vdDptaW5l" and got[-1] is None  # root:mine, then no credentials
    assert set(got) == {"Basic cm9vdDptaW5l", None}
    asked = len(got)
    # and the other way: root does not read the second user's file, nor that user another's
    _refused(_cluster(own), f"uid {NOBODY}")
    os.chown(root_owned, 1, 1)  # daemon's
    _refused(_cluster(root_owned, *_as_nobody()), "uid 1")
    assert len(got) == asked


@needs_root
def test_the_exporters_web_config_and_its_tls_files_are_trusted_the_same(shared: Path) -> None:
    web = shared / "web.yml"
    web.write_text("basic_auth_users: {}\n")
    os.chown(web, NOBODY, NOBODY)
    r = subprocess.run([sys.executable, "-m", "dltop", "export", "--listen", "127.0.0.1:0", "--web-config",
                        str(web)], capture_output=True, text=True, cwd="/", timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": "/nonexistent"})
    _refused(r, "--web-config", f"uid {NOBODY}")
    os.chown(web, 0, 0)
    (shared / "cert.pem").write_text("not read\n")
    key = shared / "key.pem"
    key.write_text("not read\n")
    key.chmod(0o666)
    web.write_text("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n")
    with pytest.raises(DltopError, match=r"key_file .*key\.pem: is writable by group and others .*refused"):
        load_web_config(str(web))
    key.chmod(0o600)
    os.chown(shared / "cert.pem", NOBODY, NOBODY)
    with pytest.raises(DltopError, match=rf"cert_file .*cert\.pem: is owned by uid {NOBODY}"):
        load_web_config(str(web))
    os.chown(shared / "cert.pem", 0, 0)
    with pytest.raises(DltopError, match="cannot load cert_file/key_file"):  # trusted: read, and not a key
        load_web_config(str(web))
