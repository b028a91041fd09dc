"""A tiny real PyTorch training run (CPU) over a dataset it writes to disk, with dltop's probe in it.

The samples are files, read in DataLoader workers through a Dataset, so the page cache matters: the dataset is
dropped from the page cache after it is written (unless --warm), and the first epoch reads it from disk while
the later ones find it cached. For demos, screenshots and dltop's end-to-end tests; it finishes in seconds:

    python examples/train_tiny.py                      # 3 epochs, 64 files of 1 MiB, 2 workers
    python examples/train_tiny.py --decode-ms 20       # a slow decode: the data wait grows, the disk idles
    python examples/train_tiny.py --linger 60          # keep publishing after training (look at it with dltop)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from dltop import probe

FEATURES = 64
CLASSES = 4


def write_dataset(root: str, files: int, size_bytes: int) -> None:
    """`files` samples of `size_bytes` random bytes each, kept when they are there already."""
    os.makedirs(root, exist_ok=True)
    for i in range(files):
        path = os.path.join(root, f"sample-{i:05d}.bin")
        if os.path.exists(path) and os.path.getsize(path) == size_bytes:
            continue
        with open(path + ".tmp", "wb") as f:
            f.write(os.urandom(size_bytes))
        os.replace(path + ".tmp", path)


def drop_from_page_cache(root: str) -> None:
    """Write the dataset out and drop its pages, so the first epoch reads from disk (fsync, then FADV_DONTNEED)."""
    for name in os.listdir(root):
        fd = os.open(os.path.join(root, name), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class FileDataset(Dataset):
    """One file per sample: read it, "decode" it (bytes to floats, averaged into FEATURES values)."""

    def __init__(self, root: str, decode_s: float) -> None:
        self.root = root  # the probe names the dataset's folder from here
        self.names = sorted(n for n in os.listdir(root) if n.endswith(".bin"))
        self.decode_s = decode_s

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with open(os.path.join(self.root, self.names[i]), "rb") as f:
            raw = bytearray(f.read())
        x = torch.frombuffer(raw, dtype=torch.uint8).float()
        x = x[: len(x) // FEATURES * FEATURES].view(-1, FEATURES).mean(0) / 255.0
        if self.decode_s:
            time.sleep(self.decode_s)  # an expensive decode (JPEG, augmentation), done in the worker
        return x, i % CLASSES


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--files", type=int, default=64, help="samples in the dataset (one file each)")
    ap.add_argument("--size-kib", type=int, default=1024, help="size of each sample file")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--decode-ms", type=float, default=0.0, help="artificial decode time per sample")
    ap.add_argument("--step-ms", type=float, default=0.0, help="artificial compute time per step")
    ap.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "dltop-train-tiny"))
    ap.add_argument("--warm", action="store_true", help="leave the dataset in the page cache")
    ap.add_argument("--probe-interval", type=float, default=1.0, help="seconds between probe publications")
    ap.add_argument("--linger", type=float, default=0.0, help="seconds to keep publishing after training")
    args = ap.parse_args(argv)
    if args.epochs < 1 or args.files < 1 or args.size_kib < 1 or args.workers < 0 or args.batch < 1:
        print("train_tiny: --epochs, --files, --size-kib and --batch must be at least 1, --workers at least 0",
              file=sys.stderr)
        return 2

    write_dataset(args.data_dir, args.files, args.size_kib * 1024)
    if not args.warm:
        drop_from_page_cache(args.data_dir)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # a tiny model gains nothing from more, and the workers need the cores
    model = nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.LayerNorm(128), nn.Linear(128, CLASSES))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(FileDataset(args.data_dir, args.decode_ms / 1000), batch_size=args.batch, shuffle=True,
                        num_workers=args.workers, persistent_workers=args.workers > 0)
    path = probe.start(interval_s=args.probe_interval)
    probe.watch_model(model)
    probe.watch_optimizer(opt)
    print(f"probe: {path}", flush=True)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        for x, y in probe.track(loader):  # samples/s from the DataLoader's batch_size
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            probe.log(loss=loss)  # the tensor: the probe reads it off the loop (no wait for the device)
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
        e = probe.mark_epoch()
        assert e is not None
        cache = e["data_cached_delta_bytes"]  # the dataset's own pages (cachestat), not the machine's Cached
        print(f"epoch {epoch}: {e['duration_s']:.2f}s, waited {e['data_wait_s']:.2f}s for data, "
              f"data cached {'n/a' if cache is None else f'{cache / 2**20:+.0f} MiB'}, loss {loss.item():.3f}",
              flush=True)
    probe.publish()
    print("done", flush=True)
    if args.linger:
        time.sleep(args.linger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
