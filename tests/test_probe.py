"""The in-process probe (dltop.probe) with real torch on CPU: weights, gradients, optimizer state and KV bytes
counted the way torch counts them, data waits timed on a real loader, the file published privately and
atomically, fork and DataLoader-worker safety, and activation with DLTOP_PROBE=1."""

from __future__ import annotations

import gc
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import dltop.probe as probe
from dltop.probe.files import MAX_FILE_BYTES, proc_start_ticks
from tests.probe_helpers import REPO, probe_env

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0, the test extra)")


@pytest.fixture(autouse=True)
def fresh_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Each test gets the probe's state new and its own probe directory."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(probe, "state", probe._State())
    yield
    probe.stop()


def _storage_bytes(tensors) -> int:
    # torch's own count of the memory behind each tensor (each of these owns its storage)
    return sum(t.untyped_storage().nbytes() for t in tensors)


class Net(torch.nn.Module):
    """Parameters of two dtypes, running-stat buffers (BatchNorm) and a buffer of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.lin = torch.nn.Linear(16, 32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.head = torch.nn.Linear(32, 4, dtype=torch.float64)
        self.register_buffer("mask", torch.ones(7, dtype=torch.int64), persistent=False)

    def forward(self, x):
        return self.head(self.bn(self.lin(self.emb(x))).double())


def _model():
    return Net()


def test_weights_are_parameters_and_buffers_gradients_and_optimizer_apart() -> None:
    model = _model()
    probe.watch_model(model)
    cpu = probe.report()["devices"]["cpu"]
    assert cpu["weights_bytes"] == _storage_bytes([*model.parameters(), *model.buffers()])
    assert cpu["gradients_bytes"] == 0 and cpu["optimizer_bytes"] == 0

    opt = torch.optim.Adam(model.parameters())
    probe.watch_optimizer(opt)
    x = torch.randint(0, 50, (8,))
    model(x).sum().backward()
    opt.step()
    cpu = probe.report()["devices"]["cpu"]
    assert cpu["gradients_bytes"] == _storage_bytes(p.grad for p in model.parameters())
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    assert cpu["optimizer_bytes"] == _storage_bytes(state)
    # Adam keeps two moments per parameter: more than twice the weights' parameters
    assert cpu["optimizer_bytes"] > 2 * _storage_bytes(model.parameters())


def test_watching_keeps_nothing_alive() -> None:
    model = _model()
    probe.watch_model(model)
    assert probe.report()["devices"]["cpu"]["weights_bytes"] > 0
    del model
    gc.collect()
    assert probe.report()["devices"] == {}


class Obj:
    """A plain object with attributes, as transformers' Cache and its layers are (weak references work)."""

    def __init__(self, **attrs) -> None:
        self.__dict__.update(attrs)


def _kv(layers: int = 3):
    return [(torch.zeros(1, 2, 7, 8, dtype=torch.float16), torch.zeros(1, 2, 7, 8, dtype=torch.float16))
            for _ in range(layers)]


@pytest.mark.parametrize("layout", ["transformers-4.5x", "transformers-5.x", "tuple-of-tuples", "tensor-list"])
def test_kv_caches_in_every_layout(layout: str) -> None:
    kv = _kv()
    expected = _storage_bytes(t for pair in kv for t in pair)
    if layout == "transformers-4.5x":  # DynamicCache: key_cache / value_cache lists
        obj = Obj(key_cache=[k for k, _ in kv], value_cache=[v for _, v in kv])
    elif layout == "transformers-5.x":  # DynamicCache: layers[i].keys / .values
        obj = Obj(layers=[Obj(keys=k, values=v) for k, v in kv])
    elif layout == "tuple-of-tuples":
        obj = tuple(kv)
    else:
        obj = [t for pair in kv for t in pair]
    probe.watch_kv(obj)
    assert probe.report()["devices"]["cpu"]["kv_bytes"] == expected


def test_a_growing_cache_object_is_read_each_time() -> None:
    cache = Obj(layers=[])
    probe.watch_kv(cache)
    assert probe.report()["devices"] == {}
    cache.layers.append(Obj(keys=torch.zeros(4, 4), values=torch.zeros(4, 4)))
    assert probe.report()["devices"]["cpu"]["kv_bytes"] == 2 * 16 * 4


def _tiny_llama():
    """A Llama of two layers with random weights, from a config (nothing downloaded)."""
    tr = pytest.importorskip("transformers", reason="transformers is not installed (the test extra)")
    cfg = tr.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return tr, cfg, tr.LlamaForCausalLM(cfg).eval()


def test_a_real_transformers_dynamic_cache_grows_as_it_is_read() -> None:
    tr, cfg, model = _tiny_llama()
    cache = tr.DynamicCache(config=cfg)
    probe.watch_model(model)
    probe.watch_kv(cache)
    with torch.no_grad():
        model(torch.randint(0, 64, (1, 5)), cache=cache, use_cache=True)
    layers = cache.layers
    assert len(layers) == 2 and tuple(layers[0].keys.shape) == (1, 2, 5, 8)  # batch, KV heads, tokens, head dim
    cpu = probe.report()["devices"]["cpu"]
    assert cpu["kv_bytes"] == _storage_bytes(t for layer in layers for t in (layer.keys, layer.values))
    assert cpu["kv_bytes"] == 2 * 2 * (1 * 2 * 5 * 8) * 4  # layers x (K, V) x elements x float32
    assert cpu["weights_bytes"] == _storage_bytes([*model.parameters(), *model.buffers()])
    with torch.no_grad():  # three more tokens: the cache object is read again, not remembered
        model(torch.randint(0, 64, (1, 3)), cache=cache, use_cache=True)
    assert probe.report()["devices"]["cpu"]["kv_bytes"] == 2 * 2 * (1 * 2 * 8 * 8) * 4


def test_a_real_transformers_static_cache_counts_what_it_preallocated() -> None:
    tr, cfg, model = _tiny_llama()
    cache = tr.StaticCache(config=cfg, max_cache_len=16)
    with torch.no_grad():
        model(torch.randint(0, 64, (1, 5)), cache=cache, use_cache=True)
    probe.watch_kv(cache)
    # all 16 positions are held whether used or not: that is what the memory costs
    assert probe.report()["devices"]["cpu"]["kv_bytes"] == 2 * 2 * (1 * 2 * 16 * 8) * 4


def test_job_identity_data_dir_and_recompiles_are_published(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 2))
    ds.root = str(tmp_path)  # as torchvision's datasets say where they read
    for _ in probe.track(torch.utils.data.DataLoader(ds, batch_size=2)):
        pass
    doc = probe.report()
    assert doc["job_id"] == f"10.0.0.7:29500 parent {os.getppid()}" and doc["ppid"] == os.getppid()
    assert doc["data"]["data_dir"] == str(tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-42")
    assert probe.report()["job_id"] == "run-42"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun without --rdzv-id: every job's run id
    assert probe.report()["job_id"] == f"torchrun agent {os.getppid()} 10.0.0.7:29500"

    @torch.compile(backend="eager", dynamic=False)
    def double(x):
        return x * 2

    before = probe.report()["compile"]["recompiles"]
    for n in range(1, 5):  # the first shape compiles, each new one recompiles
        double(torch.zeros(n))
    assert probe.report()["compile"]["recompiles"] - before == 3


def test_many_devices_and_epochs_fit_4_kib() -> None:
    """A process on 8 GPUs (DataParallel) with the largest numbers and 16 epochs: old epochs go first, then the
    allocator numbers of the devices listed last; the file is always written."""
    stats = dict.fromkeys(probe.MEMORY_STATS, 10**12)
    doc = probe.report()
    doc["cmd"] = "x" * 256
    doc["allocator_env"] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    # torch.compile's counters are there once a test before this one (in this worker) compiled: set here
    doc["compile"] = dict.fromkeys(("eager_fallbacks", "recompiles", "unique_graphs", "graph_breaks", "frames_ok",
                                    "fx_graph_cache_hits", "fx_graph_cache_misses"), 10**6)
    doc["devices"] = {f"cuda:{i}": {"weights_bytes": 10**12, "gradients_bytes": 10**12, "optimizer_bytes": 10**12,
                                    "kv_bytes": 10**12, "memory_stats": stats,
                                    "uuid": f"5e3c1a7e-0000-0000-0000-00000000000{i}"} for i in range(8)}
    doc["epochs"] = [{"index": i, "started_at": 1.7e9, "ended_at": 1.7e9, "duration_s": 1234.567891,
                      "data_wait_s": 123.456789, "steps": 10**6, "page_cache_delta_bytes": -10**12,
                      "gpu_util": None} for i in range(probe.MAX_EPOCHS)]
    data = probe.encode(doc)
    assert data is not None and len(data) <= MAX_FILE_BYTES
    out = json.loads(data)
    assert out["truncated"] == ["epochs", "allocator_env", "cmd", "compile", "memory_stats"]
    assert [e["index"] for e in out["epochs"]] == [probe.MAX_EPOCHS - 1]  # the newest kept
    kept = [n for n, d in out["devices"].items() if "memory_stats" in d]
    assert kept == [f"cuda:{i}" for i in range(len(kept))] and 0 < len(kept) < 8
    assert all(d["uuid"] and d["weights_bytes"] == 10**12 for d in out["devices"].values())
    # one GPU and 16 epochs (the common case): only old epochs go
    doc["devices"] = {"cuda:0": doc["devices"]["cuda:0"]}
    out = json.loads(probe.encode(doc) or b"{}")
    assert out["truncated"] == ["epochs"] and out["epochs"][-1]["index"] == probe.MAX_EPOCHS - 1


def test_the_wait_fraction_is_what_the_loop_waited() -> None:
    """A loader that sleeps a known time: the probe's waits lie between the sleeps (measured inside the loader)
    and the gaps the loop saw between its bodies, on the same clock, so the bounds hold however loaded the
    machine is."""
    n, sleep_s, work_s = 12, 0.02, 0.01  # 20 ms of every 30 ms waiting: a fraction near 2/3
    clock = time.perf_counter_ns
    slept: list[int] = []

    def slow_loader():
        for i in range(n):
            t = clock()
            time.sleep(sleep_s)
            slept.append(clock() - t)
            yield torch.full((2, 3), i)

    got, bodies = [], []
    before = clock()
    for batch in probe.track(slow_loader()):
        start = clock()
        got.append(int(batch[0, 0]))
        time.sleep(work_s)
        bodies.append((start, clock()))
    assert got == list(range(n))
    data = probe.report()["data"]
    assert data["steps"] == n and data["recent_steps"] == n - 1 and data["input_shapes"] == 1
    wait_ns, step_ns = data["recent_wait_s"] * 1e9, data["recent_step_s"] * 1e9
    gaps = [bodies[i][0] - bodies[i - 1][1] for i in range(1, n)]  # body end to next body start, per step
    assert sum(slept[1:]) - 1 <= wait_ns <= sum(gaps) + 1  # (the first item has no step before it)
    assert bodies[-2][1] - bodies[0][0] - 1 <= step_ns <= bodies[-1][0] - before + 1
    fraction = wait_ns / step_ns
    assert sum(slept[1:]) / (bodies[-1][0] - before) <= fraction <= sum(gaps) / (bodies[-2][1] - bodies[0][0])
    epoch = probe.mark_epoch()
    assert epoch is not None and epoch["steps"] == n
    assert sum(slept) / 1e9 - 1e-6 <= epoch["data_wait_s"] < epoch["duration_s"]
    assert isinstance(epoch["machine_cached_delta_bytes"], int)
    # No data_dir named: the files this process has open read-only are measured. Inside a test suite some may be
    # (another test's): then it is a number over those, and says so; else unknown, and says how to name it.
    if epoch["data_cached_delta_bytes"] is None:
        assert "data_dir" in epoch["data_cached_source"]
    else:
        assert "files open in the process and its workers" in epoch["data_cached_source"]
    assert probe.mark_epoch() is None  # nothing open
    assert [e["index"] for e in probe.report()["epochs"]] == [0]


def test_a_real_dataloader_with_workers(tmp_path: Path) -> None:
    ds = torch.utils.data.TensorDataset(torch.arange(64.0).reshape(32, 2))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
    for _ in range(2):
        items = [b[0].sum().item() for b in probe.track(loader)]
        probe.mark_epoch()
    assert items == [b[0].sum().item() for b in loader]
    doc = probe.report()
    assert doc["data"]["loader_workers"] == 2 and doc["data"]["pin_memory"] is False
    assert doc["data"]["steps"] == 16 and [e["steps"] for e in doc["epochs"]] == [8, 8]


def test_page_cache_delta_sees_a_dataset_read_in(tmp_path: Path) -> None:
    data = tmp_path / "shard.bin"
    data.write_bytes(os.urandom(64 << 20))
    fd = os.open(data, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache
    os.close(fd)

    def reader():
        with open(data, "rb") as f:
            while chunk := f.read(1 << 20):
                yield chunk

    before = _fincore_bytes([data])
    assert sum(len(c) for c in probe.track(reader(), data_dir=str(tmp_path))) == 64 << 20
    epoch = probe.mark_epoch()
    assert epoch is not None
    # the job's data: what fincore says the file gained (nothing else on the machine is in it)
    assert epoch["data_cached_delta_bytes"] == _fincore_bytes([data]) - before
    assert epoch["data_cached_delta_bytes"] > 32 << 20 and epoch["data_cached_source"] == "cachestat: 1 files under data_dir"
    # Cached grew by about the 64 MiB read in (other work on the machine moves it too: a loose bound)
    assert epoch["machine_cached_delta_bytes"] > 16 << 20


def _fincore_bytes(paths: list[Path]) -> int:
    """What util-linux's fincore says the files hold in the page cache."""
    r = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, paths)],
                       capture_output=True, text=True, check=True, timeout=60)
    return sum(int(x) for x in r.stdout.split())


def test_published_file_is_private_atomic_and_within_the_limit(tmp_path: Path) -> None:
    model = _model()
    probe.watch_model(model)
    path = probe.start(interval_s=0.05)
    assert path == str(tmp_path / "dltop" / f"{os.getpid()}.json")
    assert probe.start() == path  # idempotent: one thread
    assert sum(t.name == "dltop-probe" for t in __import__("threading").enumerate()) == 1
    assert stat.S_IMODE(os.stat(tmp_path / "dltop").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    time.sleep(0.3)
    # no temp file left behind; beside the file, the (empty) one SIGTERM would write its stack into
    assert sorted(os.listdir(tmp_path / "dltop")) == [f"{os.getpid()}.json", f"{os.getpid()}.signal"]
    assert os.path.getsize(tmp_path / "dltop" / f"{os.getpid()}.signal") == 0
    doc = json.loads(Path(path).read_text())
    assert doc["format"] == 1 and doc["pid"] == os.getpid()
    assert doc["start_time_ticks"] == proc_start_ticks(os.getpid())
    assert doc["devices"]["cpu"]["weights_bytes"] > 0 and doc["torch"] == torch.__version__
    probe.stop()
    assert not Path(path).exists()


def _published(path: str) -> dict:
    return json.loads(Path(path).read_text())


def _until(check, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_the_publisher_reuses_its_tensor_count_until_due_or_a_new_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "TENSOR_DUTY", 1e-12)  # a count "costs" so much that the thread never recounts
    a = torch.nn.Linear(8, 8)
    probe.watch_model(a)
    path = probe.start(interval_s=0.02)
    assert path is not None
    first = _published(path)
    assert first["devices"]["cpu"]["weights_bytes"] == _storage_bytes(a.parameters())
    a(torch.zeros(1, 8)).sum().backward()  # gradients appear
    _until(lambda: _published(path)["published_at"] > first["published_at"] + 0.05, "no new publication")
    again = _published(path)
    assert again["devices"]["cpu"]["gradients_bytes"] == 0  # the thread's count is the old one ...
    assert again["tensors_counted_at"] == first["tensors_counted_at"]  # ... and says how old
    assert probe.report()["devices"]["cpu"]["gradients_bytes"] == _storage_bytes(p.grad for p in a.parameters())
    b = torch.nn.Linear(64, 64)
    probe.watch_model(b)  # a new watch is counted at the next publication
    both = _storage_bytes([*a.parameters(), *b.parameters()])
    _until(lambda: _published(path)["devices"]["cpu"]["weights_bytes"] == both, "the new model was not counted")


MEMFD_CHECK = r"""
import fcntl, json, os, sys
from pathlib import Path
from dltop import probe
from dltop.probe.files import MEMFD_LINK, SEALS
folder = Path(sys.argv[1])
# The folder is refused: the report goes into a sealed memfd the process holds, which dltop finds from the
# process (/proc/PID/fd), and nothing is written through the symlink.
path = probe.start()
assert path == f"/proc/{os.getpid()}/fd/{probe.state.memfd}" and os.readlink(path) == MEMFD_LINK, path
assert fcntl.fcntl(probe.state.memfd, fcntl.F_GET_SEALS) & SEALS == SEALS  # no one can change it
doc = json.loads(Path(path).read_bytes())
assert doc["pid"] == os.getpid() and str(folder) in doc["folder_refused"], doc
fd = probe.state.memfd
probe.publish()
assert probe.state.memfd == fd and os.readlink(path) == MEMFD_LINK  # replaced in place (dup2)
probe.stop()
assert probe.state.memfd is None and not os.path.exists(path)
print("ok")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (setpriv: the probe runs as a user of its own)")
def test_a_symlinked_or_shared_directory_is_not_published_into(reachable_dir: Path) -> None:
    # As a user of its own, so that no root dltop another test runs counts this probe (its memfd is findable)
    base = reachable_dir
    run = base / "run"
    elsewhere = base / "elsewhere"
    run.mkdir()
    elsewhere.mkdir(mode=0o700)
    os.chmod(base, 0o755)
    os.chown(run, 65530, 65530)
    os.chown(elsewhere, 65530, 65530)
    (run / "dltop").symlink_to(elsewhere)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "XDG_RUNTIME_DIR": str(run)}
    user = ["setpriv", "--reuid=65530", "--regid=65530", "--clear-groups"]
    out = subprocess.run([*user, sys.executable, "-c", MEMFD_CHECK, str(run / "dltop")], env=env, cwd="/",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert "cannot publish" in out.stderr and os.listdir(elsewhere) == []
    # a folder others can write is refused the same way
    (run / "dltop").unlink()
    (run / "dltop").mkdir()
    os.chmod(run / "dltop", 0o777)
    out = subprocess.run([*user, sys.executable, "-c", MEMFD_CHECK, str(run / "dltop")], env=env, cwd="/",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert os.listdir(run / "dltop") == []


def test_over_4_kib_the_oldest_epochs_go_first() -> None:
    doc = probe.report()
    doc["epochs"] = [{"index": i, "started_at": 1e9, "ended_at": 1e9, "duration_s": 1.5, "data_wait_s": 0.5,
                      "steps": 100, "page_cache_delta_bytes": 123456789, "gpu_util": None} for i in range(40)]
    data = probe.encode(doc)
    assert data is not None and len(data) <= MAX_FILE_BYTES
    out = json.loads(data)
    assert out["truncated"] == ["epochs"] and out["epochs"][-1]["index"] == 39 and len(out["epochs"]) < 40
    doc["cmd"] = "x" * 10_000  # cannot happen (cut to 256), but nothing may make the probe write a torn file
    doc["allocator_env"] = {"PYTORCH_CUDA_ALLOC_CONF": "y" * 5000}
    data = probe.encode(doc)
    assert data is not None and json.loads(data)["truncated"] == ["epochs", "allocator_env", "cmd"]


def _run(code: str, runtime_dir: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=probe_env(runtime_dir, **env), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_a_forked_child_does_not_inherit_the_publisher(tmp_path: Path) -> None:
    code = """
import os, time, dltop.probe as probe
probe.start(interval_s=0.05)
pid = os.fork()
if pid == 0:
    time.sleep(0.5)
    os._exit(0 if probe.state.thread is None else 3)
_, status = os.waitpid(pid, 0)
print(pid, os.waitstatus_to_exitcode(status), sorted(os.listdir(os.environ["XDG_RUNTIME_DIR"] + "/dltop")))
"""
    r = _run(code, tmp_path)
    child, rc, names = r.stdout.split(" ", 2)
    assert rc == "0", r.stderr
    assert f"{child}.json" not in names and str(os.getpid()) not in names


def test_dataloader_workers_do_not_publish(tmp_path: Path) -> None:
    code = """
import os, torch, dltop.probe as probe
class DS(torch.utils.data.Dataset):
    def __len__(self): return 4
    def __getitem__(self, i): return torch.tensor([os.getpid(), probe.start() is None])
print(sorted({tuple(x.tolist()) for b in torch.utils.data.DataLoader(DS(), num_workers=2) for x in b}))
print(os.listdir(os.environ["XDG_RUNTIME_DIR"] + "/dltop") if os.path.isdir(os.environ["XDG_RUNTIME_DIR"] + "/dltop") else [])
"""
    r = _run(code, tmp_path)
    assert r.returncode == 0, r.stderr
    workers, files = (eval(line) for line in r.stdout.splitlines())
    assert len(workers) == 2 and all(started_nothing == 1 for _, started_nothing in workers)
    assert files == []


ZERO_CODE = """
import json, os, torch
train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(32, 4)), batch_size=4)
val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 4)), batch_size=4)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).to("cpu")
model[0].to("cpu")  # a submodule that reaches .to too: counted once
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for epoch in range(2):
    for (x,) in train:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    for (x,) in val:
        model(x)
print(os.getpid(), flush=True)
"""


def test_dltop_probe_1_learns_without_code_changes(tmp_path: Path) -> None:
    """A script that knows nothing of dltop, run with DLTOP_PROBE=1: step time from its DataLoader (the train
    loader's 16 batches; the validation loader not mixed in), an epoch per pass, the weights of the module that
    reached .to(), the optimizer's state and steps (issue 18, item 10); its file stays with its exit record."""
    r = _run(ZERO_CODE, tmp_path, DLTOP_PROBE="1", PYTHONPATH=str(REPO))
    assert r.returncode == 0, r.stderr
    doc = _published(str(tmp_path / "dltop" / f"{int(r.stdout)}.json"))
    assert doc["exit"]["how"] == "exit" and doc["optimizer_steps"] == 16
    assert doc["data"]["steps"] == 16 and doc["data"]["loader_workers"] == 0
    assert [e["steps"] for e in doc["epochs"]] == [8, 8]  # the last pass closed at exit
    params_bytes = (4 * 8 + 8 + 8 * 2 + 2) * 4
    assert doc["devices"]["cpu"]["weights_bytes"] == params_bytes  # the submodule's .to() not counted twice
    assert doc["devices"]["cpu"]["optimizer_bytes"] == params_bytes  # SGD's momentum buffers
    assert doc["watched"] == {"models": 2, "optimizers": 1, "kv": 0}


def test_dltop_probe_1_publishes_nothing_for_a_process_that_does_not_train(tmp_path: Path) -> None:
    """No torch (multiprocessing's resource_tracker, a shell's python -c), or torch imported but no training:
    no file, no junk job."""
    ls = "d = os.environ['XDG_RUNTIME_DIR'] + '/dltop'; print(os.listdir(d) if os.path.isdir(d) else [])"
    for code in ("import os, time; time.sleep(0.3)", "import os, time, torch; time.sleep(0.3)"):
        r = _run(f"{code}; {ls}", tmp_path, DLTOP_PROBE="1", PYTHONPATH=str(REPO))
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert r.stdout.strip() == "[]"  # while it runs, and after
    r = _run("import sys; print('dltop.probe' in sys.modules)", tmp_path)
    assert r.stdout.strip() == "False"  # without the variable the hook imports nothing


def test_dltop_probe_1_costs_an_interpreter_start_one_small_module(tmp_path: Path) -> None:
    """What DLTOP_PROBE=1 loads at start in a process that never imports torch: dltop's version and the finder,
    nothing else of dltop or the stdlib that `python -c pass` does not load (json, threading, weakref: the
    2.5x start-up of before). benchmarks/probe.py measures the time."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "dltop_probe.pth").write_text((REPO / "dltop/probe/dltop_probe.pth").read_text())
    code = (f"import sys; before = set(sys.modules); import site; site.addsitedir({str(site_dir)!r}); "
            "print(sorted(set(sys.modules) - before - {'site'}))")
    out = {}
    for mode in ("0", "1"):
        r = subprocess.run([sys.executable, "-S", "-c", code], env=probe_env(tmp_path, DLTOP_PROBE=mode),
                           capture_output=True, text=True, timeout=30, cwd=REPO)
        assert r.returncode == 0, r.stderr
        out[mode] = set(eval(r.stdout))
    assert out["1"] - out["0"] == {"dltop", "dltop.autoprobe"}
def test_the_pth_hook_is_harmless_when_dltop_is_half_installed(tmp_path: Path) -> None:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "dltop_probe.pth").write_text((REPO / "dltop/probe/dltop_probe.pth").read_text())
    code = f"import sys, site; sys.modules['dltop'] = None; site.addsitedir({str(site_dir)!r}); print('ran on')"
    r = subprocess.run([sys.executable, "-S", "-c", code], env=probe_env(tmp_path, DLTOP_PROBE="1"),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == "ran on"
    assert r.stderr.startswith("dltop.probe: DLTOP_PROBE is set but the probe did not start")
    assert "Traceback" not in r.stderr


def test_import_is_light_in_a_fresh_interpreter() -> None:
    code = ("import sys, dltop.probe\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('textual', 'rich', 'psutil', 'pynvml', 'torch', 'numpy', 'prometheus_client'))\n"
            "ours = sorted(m for m in sys.modules if m.split('.')[0] == 'dltop')\n"
            "print(heavy, ours)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.stdout.strip() == "[] ['dltop', 'dltop.probe', 'dltop.probe.files']", r.stderr


class FakeCuda:
    """torch.cuda as a process with a GPU shows it (this machine has none): what the probe asks is recorded."""

    def __init__(self, initialized: bool) -> None:
        self.initialized = initialized
        self.asked: list[int] = []

    def is_initialized(self) -> bool:
        return self.initialized

    def current_device(self) -> int:
        return 1

    def memory_stats(self, index: int) -> dict[str, int]:
        self.asked.append(index)
        return {"allocated_bytes.all.current": 10 << 20, "reserved_bytes.all.current": 32 << 20,
                "num_alloc_retries": 2, "num_ooms": 0, "segment.all.current": 7}

    def get_device_properties(self, index: int):
        return Obj(uuid=f"5e3c1a7e-0000-0000-0000-00000000000{index}")


@pytest.mark.parametrize("initialized", [False, True])
def test_cuda_is_asked_only_once_the_process_initialised_it(monkeypatch: pytest.MonkeyPatch,
                                                            initialized: bool) -> None:
    cuda = FakeCuda(initialized)
    monkeypatch.setitem(sys.modules, "torch", Obj(cuda=cuda, __version__="2.13.0+cu130"))
    devices = probe.report()["devices"]
    if not initialized:
        assert cuda.asked == [] and devices == {}
        return
    assert cuda.asked == [1]  # the current device only: no other device gets an allocator by our asking
    assert devices["cuda:1"]["memory_stats"] == {"allocated_bytes.all.current": 10 << 20,
                                                 "reserved_bytes.all.current": 32 << 20,
                                                 "num_alloc_retries": 2, "num_ooms": 0}
    assert devices["cuda:1"]["uuid"].endswith("0001")


def test_torch_imported_but_unused_stays_without_cuda() -> None:
    probe.watch_model(model := _model())
    probe.report()
    assert model is not None and not torch.cuda.is_initialized()


def test_the_files_a_job_writes_are_not_its_data(tmp_path: Path) -> None:
    # Without a data_dir the epoch's cache delta is over the files the job has open: a log it appends to or a
    # checkpoint it writes would grow in the page cache and read as its data coming in. Only read-only ones count.
    from dltop.probe import _open_files

    data, log = tmp_path / "shard.bin", tmp_path / "train.log"
    data.write_bytes(b"x" * 4096)
    with open(data, "rb"), open(log, "ab"), open(tmp_path / "ckpt.pt", "w+b"):
        found = _open_files()
    assert str(data) in found and str(log) not in found and str(tmp_path / "ckpt.pt") not in found


def test_the_recent_numbers_cover_a_time_window_and_go_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    """20 fast steps, then slow ones (each at least 0.3 s: a sleep): with a 1 s window only slow steps are in the
    recent numbers, however loaded the machine (a 256-step mean showed a 10x jump as 4.5x); when the loop stops,
    none are, and the last step's age says how long ago it ended (issue 18, item 7)."""
    monkeypatch.setattr(probe, "WINDOW_S", 1.0, raising=False)
    slow_s = 0.3
    for i, _ in enumerate(probe.track(range(26))):
        if i >= 20:
            time.sleep(slow_s)
    data = probe.report()["data"]
    assert data["window_s"] == 1.0 and data["steps"] == 26 and data["in_epoch"] is True
    assert 1 <= data["recent_steps"] <= 6  # only the slow ones ended within the window
    assert data["recent_step_s"] / data["recent_steps"] >= slow_s
    assert data["last_step_s"] >= slow_s and data["last_step_age_s"] >= 0
    time.sleep(1.1)  # the loop stopped: nothing ended within the window
    data = probe.report()["data"]
    assert data["recent_steps"] == 0 and data["recent_step_s"] == 0 and data["last_step_age_s"] >= 1.1


def test_an_uncaught_exception_is_the_exit_record(tmp_path: Path) -> None:
    """A job that dies of torch.OutOfMemoryError leaves its file with an exit record saying so (issue 18, item
    9); dltop reads it as an exited process, ended with exit code 1 and the error."""
    code = """
import os, torch, dltop.probe as probe
probe.start(interval_s=0.05)
for _ in probe.track(range(3)):
    pass
probe.mark_epoch()
print(os.getpid(), flush=True)
raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
"""
    r = _run(code, tmp_path)
    assert r.returncode == 1 and "OutOfMemoryError" in r.stderr  # the script's own traceback still shows
    pid = int(r.stdout)
    doc = _published(str(tmp_path / "dltop" / f"{pid}.json"))
    assert doc["exit"]["how"] == "exception" and doc["exit"]["exit_code"] == 1
    assert doc["exit"]["error"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    from dltop.sources.probes import read_probes
    part = read_probes([(str(tmp_path / "dltop"), os.getuid())])
    [p] = part.exited
    assert part.processes == () and p.pid == pid and [e.steps for e in p.epochs] == [3]
    assert p.ended == "exit code 1: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert p.exited_at is not None and p.exited_at >= p.published_at - 1


def test_mp_spawn_ranks_get_their_rank(tmp_path: Path) -> None:
    """mp.spawn passes the rank as an argument, not in the environment: the probe asks torch.distributed."""
    code = """
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp, dltop.probe as probe
def work(rank, path):
    dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=2)
    doc = probe.report()
    dist.barrier()
    with open(path + f".{rank}", "w") as f:
        f.write(f'{doc["rank"]} {doc["world_size"]} {doc["ppid"] == os.getppid()}')
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(work, args=(sys.argv[1],), nprocs=2)
"""
    script = tmp_path / "spawn.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "rendezvous")], capture_output=True,
                       text=True, timeout=120, cwd=REPO, env=probe_env(tmp_path, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    assert [(tmp_path / f"rendezvous.{i}").read_text() for i in (0, 1)] == ["0 2 True", "1 2 True"]


ZERO_CODE_RANK = """
import os, sys, time, torch
if __name__ == "__main__":
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 4)), batch_size=4,
                                         num_workers=1, multiprocessing_context="spawn")
    model = torch.nn.Linear(4, 2).to("cpu")
    for (x,) in loader:
        model(x)
    print(os.getpid(), flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
"""


def test_dltop_probe_1_under_torchrun_publishes_only_the_rank(tmp_path: Path) -> None:
    """torchrun's agent, multiprocessing's resource_tracker and a spawned DataLoader worker all start with the
    hook too: only the rank, which trains, publishes (issue 18, item 10: no junk jobs)."""
    script, release = tmp_path / "rank.py", tmp_path / "release"
    script.write_text(ZERO_CODE_RANK)
    env = probe_env(tmp_path, DLTOP_PROBE="1", PYTHONPATH=str(REPO))
    agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                              "--master-port", "0", str(script), str(release)], env=env, cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None
        rank = int(agent.stdout.readline() or 0)
        assert rank, agent.stderr.read() if agent.stderr else ""
        _until(lambda: os.path.exists(tmp_path / "dltop" / f"{rank}.json"), "the rank's file")
        path = str(tmp_path / "dltop" / f"{rank}.json")
        # the first file is written at start(), before the loop: the loader shows up at the next publish (1 s)
        _until(lambda: (_published(path).get("data") or {}).get("loader_workers") == 1, "the rank's loader")
        time.sleep(0.5)  # a junk publisher would have written by now: start() publishes at once
        assert sorted(os.listdir(tmp_path / "dltop")) == [f"{rank}.json", f"{rank}.signal"]  # the rank's alone
        doc = _published(path)
        assert doc["ppid"] == agent.pid and doc["rank"] == 0 and doc["data"]["loader_workers"] == 1
    finally:
        release.touch()
        agent.wait(timeout=60)


class _SpiedParameter(torch.nn.Parameter):
    """A parameter that notes which thread reads its `.grad` (the C++ autograd engine writes it without the GIL)."""

    readers: set[str] = set()

    @property  # type: ignore[override]
    def grad(self) -> torch.Tensor | None:
        _SpiedParameter.readers.add(threading.current_thread().name)
        return torch.Tensor.grad.__get__(self, torch.Tensor)  # type: ignore[attr-defined]

    @grad.setter
    def grad(self, value: torch.Tensor | None) -> None:  # zero_grad(set_to_none=True)
        torch.Tensor.grad.__set__(self, value)  # type: ignore[attr-defined]


def test_the_publisher_thread_never_reads_a_gradient_and_still_counts_them() -> None:
    # Reading .grad from the publisher thread while backward wrote it crashed training runs ("free(): corrupted
    # unsorted chunks", a segfault in libtorch_python): the training thread counts them between steps.
    model = torch.nn.Linear(32, 32)
    model.weight = _SpiedParameter(model.weight.detach().clone())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe.watch_model(model)
    probe.watch_optimizer(opt)
    _SpiedParameter.readers.clear()
    path = probe.start(interval_s=0.01)
    assert path is not None
    for x in probe.track([torch.randn(4, 32) for _ in range(40)]):
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()
        time.sleep(0.01)
    want = _storage_bytes(p.grad for p in model.parameters())
    _until(lambda: _published(path)["devices"]["cpu"]["gradients_bytes"] == want, "gradients never published")
    assert _SpiedParameter.readers and "dltop-probe" not in _SpiedParameter.readers, _SpiedParameter.readers


def test_gradients_freed_by_zero_grad_do_not_read_0_while_the_loop_trains() -> None:
    # zero_grad(set_to_none=True) frees every gradient each step: a count between it and backward read 0, one
    # during backward part of them; sampled at every point of each step, grads reads the step's full bytes
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe.watch_model(model)
    full = _storage_bytes(model.parameters())  # one gradient per parameter, of its size
    batches = [torch.randn(8, 16) for _ in range(20)]
    samples: list[int] = []

    def grads() -> int:
        return probe.report()["devices"]["cpu"]["gradients_bytes"]

    trained = False
    for x in probe.track(batches):
        if trained:
            samples.append(grads())
        opt.zero_grad(set_to_none=True)
        if trained:
            assert all(p.grad is None for p in model.parameters())  # really freed
            samples.append(grads())
        loss = model(x).square().mean()
        if trained:
            samples.append(grads())
        loss.backward()
        trained = True
        samples.append(grads())
        opt.step()
        samples.append(grads())
    assert len(samples) == 19 * 5 + 2 and set(samples) == {full}
    probe.mark_epoch()
    opt.zero_grad(set_to_none=True)
    assert grads() == 0  # the loop stopped and its gradients are gone: the count as it is


def test_a_val_loader_in_the_epoch_is_timed_apart_from_the_train_loader() -> None:
    # train then val in each epoch: the val loop's long waits (a slow loader) are not in the train step time or
    # data wait, and the epochs count the train loader's steps
    def slow(n: int, wait_s: float):
        for _ in range(n):
            time.sleep(wait_s)
            yield torch.zeros(2)

    for _epoch in range(2):
        for _x in probe.track([torch.zeros(2)] * 6):
            pass
        for _x in probe.track(slow(3, 0.02), name="val"):
            pass
        probe.mark_epoch()
    doc = probe.report()
    assert [e["steps"] for e in doc["epochs"]] == [6, 6]  # mixed, they were 9 (and 18 steps below)
    assert doc["data"]["steps"] == 12 and doc["data"]["recent_steps"] == 10
    val = doc["loaders"]["val"]
    assert val["steps"] == 6 and val["recent_steps"] == 4  # each pass's first item has no step before it
    assert val["recent_wait_s"] >= 0.02 * 4
    json.loads(probe.encode(doc))  # published within the limit


def test_throughput_and_loss_are_what_the_loop_handed_over(capsys) -> None:
    """A real DataLoader of 30 samples in batches of 8 (the last one 6): its batch_size by default, tokens by a
    function of the batch, the loss as a tensor; each epoch's samples, tokens and mean loss are the loop's own,
    and the recent rate is the recent samples over the recent steps' time."""
    ds = torch.utils.data.TensorDataset(torch.ones(30, 5))
    loader = torch.utils.data.DataLoader(ds, batch_size=8)
    losses: list[list[float]] = []
    for epoch in range(2):
        losses.append([])
        for i, (x,) in enumerate(probe.track(loader, tokens=lambda b: b[0].numel())):
            loss = x.sum() / (i + 1 + epoch)
            losses[-1].append(float(loss))
            probe.log(loss=loss)
        probe.mark_epoch()
    doc = probe.report()
    data = doc["data"]
    assert data["samples"] == 2 * 4 * 8 and data["tokens"] == 2 * 150  # the DataLoader's 8, its last batch too
    recent = data["recent_steps"]
    assert recent and data["recent_samples"] == 8 * recent  # (the first batch of an epoch has no step)
    assert [(e["samples"], e["tokens"]) for e in doc["epochs"]] == [(32, 150), (32, 150)]
    for e, mine in zip(doc["epochs"], losses, strict=True):
        assert e["loss"] == pytest.approx(sum(mine) / len(mine))
    assert doc["loss"]["value"] == pytest.approx(losses[-1][-1]) and doc["loss"]["logged"] == 8
    # a diverged loss is said, not a number that JSON cannot hold; the file is still written
    probe.log(loss=torch.tensor(float("nan")))
    doc = probe.report()
    assert doc["loss"]["value"] is None and doc["loss"]["nonfinite"] == "nan" and probe.encode(doc)
    # a count function that raises is said once and stops counting; the loop goes on
    for _ in probe.track([torch.zeros(2)] * 3, tokens=lambda b: 1 // 0):
        pass
    assert "tokens" not in probe.report()["data"] and probe.report()["data"]["steps"] == 11
    assert capsys.readouterr().err.count("counting tokens failed (ZeroDivisionError") == 1
