"""An evict's clean files are dropped by the scan itself and reported to the evict in batches: nothing lost."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from dltop.actions import pagecache as pc
from tests.test_pagecache_util import (
    PS,
    ddir_fixture,  # noqa: F401  (the `ddir` fixture)
    fincore_resident_pages,
    needs_fincore,
)


@needs_fincore
def test_an_evict_of_many_clean_files_counts_every_batch(ddir: Path) -> None:
    n = 3 * 256 + 17  # three batches of dropped files and a part one, in one folder
    files = [ddir / "many" / f"f{i:04}.bin" for i in range(n)]
    files[0].parent.mkdir()
    for f in files:
        f.write_bytes(os.urandom(2 * PS))
    mapped = ddir / "many" / "mapped.bin"
    mapped.write_bytes(os.urandom(4 * PS))
    os.sync()  # clean and resident: the files the scan drops itself
    dirty = ddir / "many" / "dirty.bin"
    dirty.write_bytes(os.urandom(3 * PS))  # dirty: handed to the evict, which flushes it first
    every = [*files, mapped, dirty]
    before = sum(fincore_resident_pages(*every).values())
    seen: list[pc.Progress] = []
    with open(mapped, "rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as m:
        for i in range(0, 4 * PS, PS):
            m[i]  # mapped pages stay: the scan's own drop leaves them, the evict says why
        r = pc.evict([str(ddir)], progress=seen.append)
        after = fincore_resident_pages(*every)
    assert r.files == r.files_done == n + 2
    assert r.resident_pages_before == before
    assert r.stayed == {"mapped": 4} and after[str(mapped)] == 4 and sum(after.values()) == 4
    assert r.resident_pages_after == 4 and r.done_bytes == (before - 4) * PS
    assert seen and seen[-1].files_done == n + 2 and seen[-1].done_bytes == r.done_bytes
