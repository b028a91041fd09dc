/* dltop.native._measure: the residency scan's per-file step (open, fstat, cachestat, close) for a batch of
 * names in one folder, without a Python call per syscall. Its Python twin is the loop in
 * dltop/residency/measure.py (resident_counts), which the scan and the watch's folder table both call.
 *
 * measure(dir_fd, names, flags, nr_cachestat) -> list, one item per name:
 *   (dev, ino, nlink, size, cache, dirty, writeback, recently_evicted) for a plain case: a regular file that
 *       opened with `flags`, is not sparse (st_blocks * 512 >= st_size) and, when it has bytes, was measured by
 *       cachestat(2) (an empty file is not asked: its counts are 0);
 *   an int for anything else: the errno of the open where it failed (EACCES, ENOENT, ELOOP, ENXIO, ...), 0 where
 *       the file was opened (and so raised its inotify open and close) but is not a plain case (fstat or
 *       cachestat failed, not a regular file, a sparse file). The Python step measures that one itself, so every
 *       decision about it (unreadable, vanished, special, sparse, EPERM, no cachestat) stays in one place.
 * measure(dir_fd, names, flags, nr_cachestat, drop_dev) -> the same, and for an evict: a plain case with pages in
 *   the page cache, none of them dirty or under writeback, one link, and on device `drop_dev` (where the evict
 *   lets the scan drop pages itself) has them dropped (POSIX_FADV_DONTNEED) and counted again: its tuple gains
 *   a ninth item, the pages resident before the drop, and its counts are those after (-1: not dropped here, the
 *   counts are the only ones, the evict's own step decides). drop_dev -1: nothing is dropped, the tuples have
 *   nine items all the same.
 * `names` is a list of str (surrogateescape, as os.fsencode) or bytes. The GIL is released around the syscalls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define API_VERSION 1

struct cs_range {
    uint64_t off, len;
};

struct cs_out {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

struct one {
    int plain, err;
    dev_t dev;
    ino_t ino;
    nlink_t nlink;
    off_t size;
    long long before;
    struct cs_out cs;
};

static void measure_one(int dfd, const char *name, int flags, long nr, long long drop_dev, struct one *r) {
    struct stat st;
    struct cs_range rng = {0, 0};
    int fd = openat(dfd, name, flags);
    r->plain = 0;
    r->err = 0;
    if (fd < 0) {
        r->err = errno;
        return;
    }
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (int64_t)st.st_blocks * 512 >= (int64_t)st.st_size) {
        r->dev = st.st_dev;
        r->ino = st.st_ino;
        r->nlink = st.st_nlink;
        r->size = st.st_size;
        memset(&r->cs, 0, sizeof r->cs);
        r->before = -1;
        if (st.st_size == 0 || syscall(nr, fd, &rng, &r->cs, 0) == 0) {
            r->plain = 1;
            if (drop_dev >= 0 && r->cs.nr_cache && !r->cs.nr_dirty && !r->cs.nr_writeback && st.st_nlink == 1 &&
                (unsigned long long)st.st_dev == (unsigned long long)drop_dev) {
                struct cs_out again;
                if (posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0 && syscall(nr, fd, &rng, &again, 0) == 0) {
                    r->before = (long long)r->cs.nr_cache;
                    r->cs = again;
                }
            }
        }
    }
    close(fd);
}

static PyObject *measure(PyObject *self, PyObject *args) {
    int dfd, flags;
    long nr;
    long long drop_dev = -2; /* -2: not given (8-tuples); -1: given, nothing dropped (9-tuples) */
    PyObject *names;
    if (!PyArg_ParseTuple(args, "iO!il|L", &dfd, &PyList_Type, &names, &flags, &nr, &drop_dev))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(names), i;
    PyObject *out = NULL;
    PyObject **enc = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    struct one *res = PyMem_Calloc(n ? n : 1, sizeof(struct one));
    if (enc == NULL || res == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) {
        if (!PyUnicode_FSConverter(PyList_GET_ITEM(names, i), &enc[i]))
            goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < n; i++)
        measure_one(dfd, PyBytes_AS_STRING(enc[i]), flags, nr, drop_dev, &res[i]);
    Py_END_ALLOW_THREADS
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (i = 0; i < n; i++) {
        PyObject *item;
        struct one *r = &res[i];
        if (r->plain && drop_dev >= -1) {
            item = Py_BuildValue("(KKKLKKKKL)", (unsigned long long)r->dev, (unsigned long long)r->ino,
                                 (unsigned long long)r->nlink, (long long)r->size,
                                 (unsigned long long)r->cs.nr_cache, (unsigned long long)r->cs.nr_dirty,
                                 (unsigned long long)r->cs.nr_writeback,
                                 (unsigned long long)r->cs.nr_recently_evicted, r->before);
            if (item == NULL) {
                Py_CLEAR(out);
                goto done;
            }
        } else if (r->plain) {
            item = Py_BuildValue("(KKKLKKKK)", (unsigned long long)r->dev, (unsigned long long)r->ino,
                                 (unsigned long long)r->nlink, (long long)r->size,
                                 (unsigned long long)r->cs.nr_cache, (unsigned long long)r->cs.nr_dirty,
                                 (unsigned long long)r->cs.nr_writeback,
                                 (unsigned long long)r->cs.nr_recently_evicted);
            if (item == NULL) {
                Py_CLEAR(out);
                goto done;
            }
        } else {
            item = PyLong_FromLong(r->err);
            if (item == NULL) {
                Py_CLEAR(out);
                goto done;
            }
        }
        PyList_SET_ITEM(out, i, item);
    }
done:
    if (enc != NULL) {
        for (i = 0; i < n; i++)
            Py_XDECREF(enc[i]);
        PyMem_Free(enc);
    }
    PyMem_Free(res);
    return out;
}

static PyMethodDef methods[] = {
    {"measure", measure, METH_VARARGS,
     "measure(dir_fd, names, flags, nr_cachestat[, drop_dev]) -> [(dev, ino, nlink, size, cache, dirty, writeback, "
     "recently_evicted), or the open's errno (0: opened, not a plain case), per name]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_measure", "The residency scan's per-file step in C.",
                                 -1, methods};

PyMODINIT_FUNC PyInit__measure(void) {
    PyObject *m = PyModule_Create(&def);
    if (m != NULL && PyModule_AddIntConstant(m, "API", API_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
