"""The residency engine: how much of a tree is in the page cache, as fincore and vmtouch count it, and the walk
that warm, evict and lock share. The Datasets source (sources/datasets.py) and the page-cache actions
(actions/pagecache.py) use it through the public names of its modules:

- walk.py     the tree walk (vmtouch's rules), a folder's running totals, what was skipped and why
- measure.py  one open file: cachestat / mincore, where its data lies, the C step (dltop/native/_measure.c)
- scan.py     `scan_residency` / `scan_paths`: a whole tree once, per folder, with its file rows (rank.py)
- watch.py    `DatasetWatch`: a tree kept up to date by inotify and a rolling pass, at a cost that does not
              grow with it
- budget.py   the bounds of a walk (cancel flag, deadline, CPU share); light: the caches walk uses it too

This file imports nothing, so that the caches walk's `budget` does not load the engine.
"""
