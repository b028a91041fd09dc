"""Reclaim the watch must know of: /proc/vmstat's counters that say page cache was reclaimed or dropped, and what
on this machine reclaims without them counting it (DAMON)."""

from __future__ import annotations

import os

from dltop.procfs import read_text

# Reclaim that /proc/vmstat's pgsteal_file does not count: DAMON's `pageout` action (a kdamond's scheme set up
# through sysfs, or the DAMON_RECLAIM module) puts pages out through reclaim_pages(), which moves no pgsteal
# counter (seen on Linux 6.18: a folder's pages read once went 1000 -> 51 resident in 105 s, pgsteal_file still).
DAMON_ADMIN = "/sys/kernel/mm/damon/admin/kdamonds"
DAMON_RECLAIM = "/sys/module/damon_reclaim/parameters/enabled"
SILENT_RECHECK_S = 60.0  # how often DAMON's configuration is read again


def _first_line(path: str) -> str:
    """A small sysfs file's text, stripped; "" where it cannot be read (or is not a regular file: never waits)."""
    try:
        return read_text(path, 256).strip()
    except OSError:
        return ""


def _entries(path: str) -> list[str]:
    try:
        return sorted((n for n in os.listdir(path) if n.isdigit()), key=int)[:64]
    except OSError:
        return []


def silent_reclaimer(admin: str | None = None, reclaim: str | None = None) -> str | None:
    """What on this machine puts page cache out without /proc/vmstat's pgsteal_file counting it, in words; None
    when nothing that DAMON's sysfs or its reclaim module shows does."""
    admin, reclaim = admin or DAMON_ADMIN, reclaim or DAMON_RECLAIM
    if _first_line(reclaim) in ("Y", "1"):
        return "DAMON_RECLAIM is on"
    for kd in _entries(admin):
        if _first_line(f"{admin}/{kd}/state") != "on":
            continue
        for ctx in _entries(f"{admin}/{kd}/contexts"):
            schemes = f"{admin}/{kd}/contexts/{ctx}/schemes"
            if any(_first_line(f"{schemes}/{s}/action") == "pageout" for s in _entries(schemes)):
                return f"DAMON pageout on (kdamond {kd})"
    return None


def read_vmstat() -> dict[str, int]:
    """Counters of /proc/vmstat that say whether page cache was reclaimed or dropped (missing ones: absent)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/vmstat", "rb") as f:
            for line in f:
                name, _, value = line.partition(b" ")
                k = name.decode()
                if k in ("pgsteal_file", "drop_pagecache"):
                    out[k] = int(value)
    except (OSError, ValueError):
        pass
    return out

