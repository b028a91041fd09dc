/* dltop.native._walk: the per-name loop of the caches walk (dltop/sources/caches.py walk_cache) for one folder.
 *
 * scan() lists one opened folder (getdents64 on its fd, as os.listdir(fd) lists it) and lstats every name
 * relative to it (fstatat AT_SYMLINK_NOFOLLOW, as os.lstat(name, dir_fd=fd)), with the GIL released around the
 * system calls. What crosses into Python is what the walk keeps: the folder's sums, its subfolders, the notes
 * (vanished, unreadable, non-UTF-8 names, symlinks), .lock files and the candidates for the kept lists. Every
 * other name stays bytes in C. Names that do cross are decoded as os.listdir decodes them
 * (PyUnicode_DecodeFSDefaultAndSize: str with surrogateescape).
 *
 * The Python loop in walk_cache is this module's twin: the tests compare the two walks field for field.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#define API_VERSION 2

#define LIMIT_MAX (1 << 24)        /* kept entries, names between looks at the budget */
#define COUNT_MAX (1LL << 62)      /* names listed so far */

/* the notes' codes in `events` (caches.py _NOTES) */
#define EV_VANISHED 0
#define EV_UNREADABLE 1
#define EV_NON_UTF8 2
#define EV_SYMLINK 3

struct dirent64_k {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* The folder's names: NUL-terminated, one after the other in buf; off[i] where name i starts, len[i] its length. */
typedef struct {
    char *buf;
    size_t used, cap;
    size_t *off;
    size_t *len;
    Py_ssize_t n, ncap;
} Names;

static void names_free(Names *ns) {
    free(ns->buf);
    free(ns->off);
    free(ns->len);
}

/* 0, or -1 with errno (ENOMEM: out of memory) */
static int names_add(Names *ns, const char *name, size_t len) {
    if (ns->n == ns->ncap) {
        Py_ssize_t ncap = ns->ncap ? 2 * ns->ncap : 256;
        size_t *off = realloc(ns->off, (size_t)ncap * sizeof(size_t));
        if (!off) return -1;
        ns->off = off;
        size_t *ln = realloc(ns->len, (size_t)ncap * sizeof(size_t));
        if (!ln) return -1;
        ns->len = ln;
        ns->ncap = ncap;
    }
    if (ns->used + len + 1 > ns->cap) {
        size_t cap = ns->cap ? 2 * ns->cap : 16384;
        while (cap < ns->used + len + 1) cap *= 2;
        char *buf = realloc(ns->buf, cap);
        if (!buf) return -1;
        ns->buf = buf;
        ns->cap = cap;
    }
    memcpy(ns->buf + ns->used, name, len);
    ns->buf[ns->used + len] = '\0';
    ns->off[ns->n] = ns->used;
    ns->len[ns->n] = len;
    ns->used += len + 1;
    ns->n++;
    return 0;
}

/* Every name of the folder open on fd but . and .. (the GIL released by the caller): 0; -1 with errno when
 * getdents64 fails (its ENOMEM too: the kernel's, an OSError as os.listdir raises it); -2 out of memory here. */
static int list_names(int fd, Names *ns) {
    enum { BUF = 65536 };
    char *buf = malloc(BUF);
    if (!buf) return -2;
    for (;;) {
        long got = syscall(SYS_getdents64, fd, buf, BUF);
        /* ENOENT: the folder was removed since it was opened (the kernel's dead directory); glibc's readdir, hence
         * os.listdir, takes it for the end of the listing, and so does this */
        if (got < 0 && errno == ENOENT) break;
        if (got < 0) {
            int e = errno;
            free(buf);
            errno = e;
            return -1;
        }
        if (got == 0) break;
        for (long pos = 0; pos < got;) {
            struct dirent64_k *d = (struct dirent64_k *)(buf + pos);
            pos += d->d_reclen;
            const char *nm = d->d_name;
            if (nm[0] == '.' && (nm[1] == '\0' || (nm[1] == '.' && nm[2] == '\0'))) continue;
            if (names_add(ns, nm, strlen(nm)) < 0) {
                free(buf);
                return -2;
            }
        }
    }
    free(buf);
    return 0;
}

/* The names of a list of str (a listing made in Python), encoded as os.lstat encodes them. */
static int names_from_list(PyObject *list, Names *ns) {
    PyObject *seq = PySequence_Fast(list, "names must be a sequence of str");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyUnicode_EncodeFSDefault(PySequence_Fast_GET_ITEM(seq, i));
        if (!b) {
            Py_DECREF(seq);
            return -1;
        }
        if (memchr(PyBytes_AS_STRING(b), '\0', (size_t)PyBytes_GET_SIZE(b))) { /* as os.lstat says it */
            Py_DECREF(b);
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "embedded null byte");
            return -1;
        }
        int r = names_add(ns, PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b));
        Py_DECREF(b);
        if (r < 0) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* st_mtime as os.stat_result has it (posixmodule.c fill_time: sec + nsec * 1e-9) */
static inline double ftime(time_t sec, long nsec) { return sec + (unsigned long)nsec * 1e-9; }

/* A sum that stays exact past int64 (hostile sparse files): a C part, flushed into a Python int on overflow. */
typedef struct {
    long long c;
    PyObject *py; /* NULL while the C part is all of it */
} Sum;

static int sum_add(Sum *s, long long v) {
    long long r;
    if (!__builtin_add_overflow(s->c, v, &r)) {
        s->c = r;
        return 0;
    }
    PyObject *a = PyLong_FromLongLong(s->c), *b = PyLong_FromLongLong(v);
    PyObject *base = s->py ? s->py : PyLong_FromLong(0);
    PyObject *t = (a && b && base) ? PyNumber_Add(base, a) : NULL;
    PyObject *u = t ? PyNumber_Add(t, b) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(base);
    Py_XDECREF(t);
    s->py = u;
    s->c = 0;
    return u ? 0 : -1;
}

static PyObject *sum_value(Sum *s) {
    PyObject *c = PyLong_FromLongLong(s->c);
    if (!c || !s->py) return c;
    PyObject *r = PyNumber_Add(s->py, c);
    Py_DECREF(c);
    return r;
}

/* The notes in the order they were met, as the Python loop notes them; vanished and symlink notes (no line of
 * their own), and the unreadable and non-UTF-8 ones once the walk's problem lines are all written (lines: how
 * many are left), that follow one another are one event with a count (run: its code, or -1, and count). */
typedef struct {
    PyObject *list;
    int run;
    long count;
    Py_ssize_t lines;
} Events;

static int events_flush(Events *ev) {
    if (ev->run < 0) return 0;
    PyObject *t = Py_BuildValue("(iOl)", ev->run, Py_None, ev->count);
    ev->run = -1;
    if (!t) return -1;
    int r = PyList_Append(ev->list, t);
    Py_DECREF(t);
    return r;
}

/* A note; name: NULL for a count of n (vanished, symlink), else the name it is about, with its errno (n). */
static int add_event(Events *ev, int code, PyObject *name, long n) {
    if (name != NULL && ev->lines <= 0) { /* no line left for it: counted, its name never crosses */
        name = NULL;
        n = 1;
    }
    if (name == NULL) {
        if (ev->run == code) {
            ev->count += n;
            return 0;
        }
        if (events_flush(ev) < 0) return -1;
        ev->run = code;
        ev->count = n;
        return 0;
    }
    if (events_flush(ev) < 0) return -1;
    ev->lines--;
    PyObject *t = Py_BuildValue("(iOl)", code, name, n);
    if (!t) return -1;
    int r = PyList_Append(ev->list, t);
    Py_DECREF(t);
    return r;
}

static int cmp_desc(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x < y) - (x > y);
}

static inline int is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

/* Whether name.encode("utf-8") fails: UTF-8 encodes every code point but the surrogates, and a name decoded with
 * surrogateescape holds one (U+DC80-U+DCFF) for each byte that was not UTF-8. No UTF-8 copy is made (and kept
 * in the str for its life, as PyUnicode_AsUTF8AndSize would). -1 with an exception where s cannot be made ready. */
static int has_surrogate(PyObject *s) {
    if (PyUnicode_READY(s) < 0) return -1; /* the decoder's str is (3.11); its kind is read only once it is */
    int kind = PyUnicode_KIND(s);
    if (kind == PyUnicode_1BYTE_KIND) return 0;
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0, n = PyUnicode_GET_LENGTH(s); i < n; i++) {
        Py_UCS4 ch = PyUnicode_READ(kind, data, i);
        if (ch >= 0xD800 && ch <= 0xDFFF) return 1;
    }
    return 0;
}

/* A candidate for the folder's kept list, its name the j-th of the listing. */
typedef struct {
    long long b, size;
    double m, a;
    Py_ssize_t j;
} Cand;

static int by_blocks(const void *x, const void *y, void *ctx) { /* biggest first, then as listed */
    const Cand *p = x, *q = y;
    (void)ctx;
    if (p->b != q->b) return p->b > q->b ? -1 : 1;
    return (p->j > q->j) - (p->j < q->j);
}

static int by_name(const void *x, const void *y, void *ctx) { /* ASCII names: as Python compares str */
    const Names *ns = ctx;
    const Cand *p = x, *q = y;
    size_t lp = ns->len[p->j], lq = ns->len[q->j];
    int c = memcmp(ns->buf + ns->off[p->j], ns->buf + ns->off[q->j], lp < lq ? lp : lq);
    return c ? c : (lp > lq) - (lp < lq);
}

/* How many of the candidates (sorted by_blocks) to hand to Python so that its list, sorted by (-blocks, name,
 * ...) and cut at `limit`, is what it would be from all of them: those bigger than the limit-th, and of those as
 * big as it, the first by name where every such name is ASCII (its bytes order as its str), else all of them. */
static Py_ssize_t cands_kept(Cand *c, Py_ssize_t n, Py_ssize_t limit, const Names *ns) {
    if (n <= limit) return n;
    long long edge = c[limit - 1].b;
    Py_ssize_t above = 0, end = limit;
    while (above < n && c[above].b > edge) above++;
    while (end < n && c[end].b == edge) end++;
    if (end == limit) return limit;
    for (Py_ssize_t i = above; i < end; i++)
        if (!is_ascii(ns->buf + ns->off[c[i].j], ns->len[c[i].j])) return end;
    qsort_r(c + above, (size_t)(end - above), sizeof(Cand), by_name, (void *)ns);
    return limit;
}

PyDoc_STRVAR(scan_doc,
"scan(fd, names, seen, keep, limit, locks_left, stop, listed, next_check, check_every, lines_left) -> tuple\n\n"
"One folder of the caches walk (dltop/sources/caches.py walk_cache, whose Python loop is this one's twin).\n"
"fd: the folder, open; names: None to list it here (getdents64), or the list of its names; seen: the set of\n"
"(st_dev, st_ino) of the hard-linked files met so far (updated); keep: whether this folder's biggest entries are\n"
"kept, at most `limit`; locks_left: how many .lock files may still be kept; stop: the budget, called (no\n"
"arguments) before each `check_every` names once `listed` reaches `next_check`; lines_left: how many of the\n"
"walk's problem lines are left (past them unreadable and non-UTF-8 names are counted, their names kept in C).\n"
"Returns (count, blocks, apparent, files, newest, oldest, atime, subdirs, kept, events, locks, listed,\n"
"next_check, stopped): blocks in st_blocks units and apparent bytes of the non-folders (a hard link met before\n"
"counts 0), regular files, their newest and oldest st_mtime and newest st_atime (-inf/inf: none); subdirs:\n"
"[(name, st_blocks, st_size)]; kept: [(-st_blocks, name, st_size, mtime, atime)], the candidates for the kept\n"
"list that can make it (mtime and atime -inf but for regular files); events: [(code, name or None, errno or\n"
"count)], 0 vanished, 1 unreadable, 2 non-UTF-8 name, 3 symlink; locks: [(name, mode, ino, dev, nlink, uid,\n"
"gid, size, atime_s, atime_ns, mtime_s, mtime_ns, ctime_s, ctime_ns, blksize, blocks, rdev)]. Raises OSError\n"
"when the listing fails, as os.listdir(fd) does (a folder removed since its open lists empty, as there).");

static PyObject *scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "scan() takes 11 arguments");
        return NULL;
    }
    long fdl = PyLong_AsLong(args[0]);
    if (fdl == -1 && PyErr_Occurred()) return NULL;
    if (fdl < 0 || fdl > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "fd out of range");
        return NULL;
    }
    int fd = (int)fdl;
    PyObject *names_in = args[1], *seen = args[2], *stop = args[6];
    int keep = PyObject_IsTrue(args[3]);
    if (keep < 0) return NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(args[4]);
    Py_ssize_t locks_left = PyLong_AsSsize_t(args[5]);
    long long listed = PyLong_AsLongLong(args[7]);
    long long next_check = PyLong_AsLongLong(args[8]);
    Py_ssize_t check_every = PyLong_AsSsize_t(args[9]);
    Py_ssize_t lines_left = PyLong_AsSsize_t(args[10]);
    if (PyErr_Occurred()) return NULL;
    if (!PySet_Check(seen)) {
        PyErr_SetString(PyExc_TypeError, "seen must be a set");
        return NULL;
    }
    if (limit < 1 || check_every < 1) {
        PyErr_SetString(PyExc_ValueError, "limit and check_every must be positive");
        return NULL;
    }
    /* 4 * limit candidates, listed + the names and next_check + check_every stay far from overflow */
    if (limit > LIMIT_MAX || check_every > LIMIT_MAX || listed < 0 || listed > COUNT_MAX || next_check > COUNT_MAX) {
        PyErr_SetString(PyExc_ValueError, "limit, check_every, listed or next_check out of range");
        return NULL;
    }

    Names ns = {0};
    if (names_in == Py_None) {
        int r, e = 0;
        Py_BEGIN_ALLOW_THREADS
        r = list_names(fd, &ns);
        if (r < 0) e = errno;
        Py_END_ALLOW_THREADS
        if (r < 0) {
            names_free(&ns);
            if (r == -2) return PyErr_NoMemory();
            errno = e;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
    } else if (names_from_list(names_in, &ns) < 0) {
        names_free(&ns);
        return NULL;
    }

    PyObject *subdirs = PyList_New(0), *kept = PyList_New(0), *locks = PyList_New(0);
    Events ev = {PyList_New(0), -1, 0, lines_left};
    PyObject *result = NULL;
    Py_ssize_t chunk = ns.n < check_every ? (ns.n ? ns.n : 1) : check_every;
    struct stat *sts = malloc((size_t)chunk * sizeof(struct stat));
    int *errs = malloc((size_t)chunk * sizeof(int));
    long long *kb = malloc((size_t)(2 * limit) * sizeof(long long));  /* the kept list's blocks, as Python's */
    Py_ssize_t ncand = 0, capcand = 4 * limit;
    Cand *cands = malloc((size_t)capcand * sizeof(Cand));
    Py_ssize_t nkb = 0;
    long long cut = -1;  /* blocks at or below this cannot make the kept list (once it is full) */
    Sum blocks = {0, NULL}, apparent = {0, NULL};
    long long files = 0;
    double newest = -Py_HUGE_VAL, oldest = Py_HUGE_VAL, atime = -Py_HUGE_VAL;
    int stopped = 0;
    if (!subdirs || !kept || !ev.list || !locks) goto done;
    if (!sts || !errs || !kb || !cands) {
        PyErr_NoMemory();
        goto done;
    }

    for (Py_ssize_t k = 0; k < ns.n; k += check_every) {
        Py_ssize_t end = k + check_every < ns.n ? k + check_every : ns.n;
        listed += end - k;
        if (listed >= next_check) { /* the budget looked at every few thousand names, in small folders too */
            next_check += check_every;
            PyObject *r = PyObject_CallNoArgs(stop);
            if (!r) goto done;
            int t = PyObject_IsTrue(r);
            Py_DECREF(r);
            if (t < 0) goto done;
            if (t) {
                stopped = 1;
                break;
            }
        }
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t j = k; j < end; j++)
            errs[j - k] = fstatat(fd, ns.buf + ns.off[j], &sts[j - k], AT_SYMLINK_NOFOLLOW) ? errno : 0;
        Py_END_ALLOW_THREADS
        for (Py_ssize_t j = k; j < end; j++) {
            const char *nm = ns.buf + ns.off[j];
            size_t nlen = ns.len[j];
            int err = errs[j - k];
            PyObject *name = NULL; /* decoded only when it crosses into Python */
            if (err == ENOENT) {
                if (add_event(&ev, EV_VANISHED, NULL, 1) < 0) goto done;
                continue;
            }
            if (err && ev.lines <= 0) {
                if (add_event(&ev, EV_UNREADABLE, NULL, 1) < 0) goto done;
                continue;
            }
            if (err) {
                name = PyUnicode_DecodeFSDefaultAndSize(nm, (Py_ssize_t)nlen);
                if (!name) goto done;
                int r = add_event(&ev, EV_UNREADABLE, name, err);
                Py_DECREF(name);
                if (r < 0) goto done;
                continue;
            }
            const struct stat *s = &sts[j - k];
            if (!is_ascii(nm, nlen)) {
                name = PyUnicode_DecodeFSDefaultAndSize(nm, (Py_ssize_t)nlen);
                if (!name) goto done;
                int su = has_surrogate(name);
                if (su < 0 || (su && add_event(&ev, EV_NON_UTF8, name, 0) < 0)) goto fail_name;
            }
            mode_t mode = s->st_mode;
            if (S_ISDIR(mode)) {
                if (!name && !(name = PyUnicode_DecodeFSDefaultAndSize(nm, (Py_ssize_t)nlen))) goto done;
                PyObject *t = Py_BuildValue("(OLL)", name, (long long)s->st_blocks, (long long)s->st_size);
                if (!t) goto fail_name;
                int r = PyList_Append(subdirs, t);
                Py_DECREF(t);
                if (r < 0) goto fail_name;
                Py_DECREF(name);
                continue;
            }
            long long b = (long long)s->st_blocks, size = (long long)s->st_size;
            if (s->st_nlink > 1) {
                PyObject *key = Py_BuildValue("(NN)", PyLong_FromUnsignedLongLong((unsigned long long)s->st_dev),
                                              PyLong_FromUnsignedLongLong((unsigned long long)s->st_ino));
                if (!key) goto fail_name;
                int in = PySet_Contains(seen, key);
                if (in > 0) b = size = 0; /* a hard link of a file counted already: du counts it once */
                int r = in < 0 ? -1 : PySet_Add(seen, key);
                Py_DECREF(key);
                if (r < 0) goto fail_name;
            }
            if (sum_add(&blocks, b) < 0 || sum_add(&apparent, size) < 0) goto fail_name;
            double m, a;
            if (S_ISREG(mode)) {
                files++;
                m = ftime(s->st_mtim.tv_sec, s->st_mtim.tv_nsec);
                a = ftime(s->st_atim.tv_sec, s->st_atim.tv_nsec);
                if (m > newest) newest = m;
                if (m < oldest) oldest = m;
                if (a > atime) atime = a;
                if (nlen >= 5 && memcmp(nm + nlen - 5, ".lock", 5) == 0 && PyList_GET_SIZE(locks) < locks_left) {
                    if (!name && !(name = PyUnicode_DecodeFSDefaultAndSize(nm, (Py_ssize_t)nlen))) goto done;
                    PyObject *t = Py_BuildValue(
                        "(OkKKKkkLLlLlLlLLK)", name, (unsigned long)s->st_mode, (unsigned long long)s->st_ino,
                        (unsigned long long)s->st_dev, (unsigned long long)s->st_nlink, (unsigned long)s->st_uid,
                        (unsigned long)s->st_gid, (long long)s->st_size, (long long)s->st_atim.tv_sec,
                        (long)s->st_atim.tv_nsec, (long long)s->st_mtim.tv_sec, (long)s->st_mtim.tv_nsec,
                        (long long)s->st_ctim.tv_sec, (long)s->st_ctim.tv_nsec, (long long)s->st_blksize,
                        (long long)s->st_blocks, (unsigned long long)s->st_rdev);
                    if (!t) goto fail_name;
                    int r = PyList_Append(locks, t);
                    Py_DECREF(t);
                    if (r < 0) goto fail_name;
                }
            } else {
                m = a = -Py_HUGE_VAL;
                if (S_ISLNK(mode) && add_event(&ev, EV_SYMLINK, NULL, 1) < 0) goto fail_name;
            }
            if (keep && b > cut) { /* a tie with the smallest kept: the first listed stays */
                if (ncand == capcand) { /* only those that can still make the list stay */
                    qsort_r(cands, (size_t)ncand, sizeof(Cand), by_blocks, NULL);
                    Py_ssize_t left = limit;
                    while (left < ncand && cands[left].b == cands[limit - 1].b) left++;
                    ncand = left;
                    if (ncand == capcand) {
                        Cand *more = realloc(cands, (size_t)(2 * capcand) * sizeof(Cand));
                        if (!more) {
                            PyErr_NoMemory();
                            goto fail_name;
                        }
                        cands = more;
                        capcand *= 2;
                    }
                }
                cands[ncand++] = (Cand){b, size, m, a, j};
                /* the Python loop's trim, on the blocks alone: its cut is the limit-th biggest kept */
                kb[nkb++] = b;
                if (nkb >= 2 * limit) {
                    qsort(kb, (size_t)nkb, sizeof(long long), cmp_desc);
                    nkb = limit;
                    cut = kb[limit - 1];
                }
            }
            Py_XDECREF(name);
            continue;
        fail_name:
            Py_XDECREF(name);
            goto done;
        }
    }
    if (events_flush(&ev) < 0) goto done;
    qsort_r(cands, (size_t)ncand, sizeof(Cand), by_blocks, NULL);
    ncand = cands_kept(cands, ncand, limit, &ns);
    for (Py_ssize_t i = 0; i < ncand; i++) {
        const Cand *c = &cands[i];
        PyObject *t = Py_BuildValue("(LNLdd)", -c->b,
                                    PyUnicode_DecodeFSDefaultAndSize(ns.buf + ns.off[c->j], (Py_ssize_t)ns.len[c->j]),
                                    c->size, c->m, c->a);
        if (!t) goto done;
        int r = PyList_Append(kept, t);
        Py_DECREF(t);
        if (r < 0) goto done;
    }
    {
        PyObject *pb = sum_value(&blocks), *pa = sum_value(&apparent);
        if (pb && pa)
            result = Py_BuildValue("(nNNLdddOOOOLLO)", ns.n, pb, pa, files, newest, oldest, atime, subdirs, kept,
                                   ev.list, locks, listed, next_check, stopped ? Py_True : Py_False);
        else {
            Py_XDECREF(pb);
            Py_XDECREF(pa);
        }
    }
done:
    Py_XDECREF(blocks.py);
    Py_XDECREF(apparent.py);
    Py_XDECREF(subdirs);
    Py_XDECREF(kept);
    Py_XDECREF(ev.list);
    Py_XDECREF(locks);
    free(sts);
    free(errs);
    free(kb);
    free(cands);
    names_free(&ns);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL, scan_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_walk",
    "The caches walk's per-name loop in C (dltop/sources/caches.py walk_cache is its Python twin).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__walk(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "API", API_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
