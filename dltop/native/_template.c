/* dltop.native._template: a recorder template's text matched at a place of a sample line (recorder/template.py).

   match(pieces, text, pos) -> (numbers, end) or None. `pieces` is the template's text cut at its numbers (a tuple
   of str, one more than the numbers); the text at `pos` matches where it is pieces[0], a JSON number, pieces[1],
   ..., a JSON number, pieces[-1], each number the longest one JSON's grammar reads there
   (-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?). Every piece after a number starts with ',', ']' or '}', so the
   longest number is the only one that can be followed by its piece: the Python twin's regex (the same pieces
   escaped, joined by the grammar's group) matches exactly the same texts, with the same numbers.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define API 1

static int same(int tk, const void *td, Py_ssize_t at, int pk, const void *pd, Py_ssize_t n) {
    if (tk == pk)
        return memcmp((const char *)td + at * tk, pd, (size_t)(n * tk)) == 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyUnicode_READ(tk, td, at + i) != PyUnicode_READ(pk, pd, i))
            return 0;
    return 1;
}

static inline int is_digit(Py_UCS4 c) { return c >= '0' && c <= '9'; }

/* The end of the longest JSON number at `at`, or -1 where none starts there. */
static Py_ssize_t number_end(int k, const void *d, Py_ssize_t at, Py_ssize_t len) {
    Py_ssize_t i = at;
    if (i < len && PyUnicode_READ(k, d, i) == '-')
        i++;
    if (i >= len || !is_digit(PyUnicode_READ(k, d, i)))
        return -1;
    if (PyUnicode_READ(k, d, i) == '0')
        i++;
    else
        while (i < len && is_digit(PyUnicode_READ(k, d, i)))
            i++;
    if (i + 1 < len && PyUnicode_READ(k, d, i) == '.' && is_digit(PyUnicode_READ(k, d, i + 1))) {
        i += 2;
        while (i < len && is_digit(PyUnicode_READ(k, d, i)))
            i++;
    }
    if (i < len && (PyUnicode_READ(k, d, i) == 'e' || PyUnicode_READ(k, d, i) == 'E')) {
        Py_ssize_t j = i + 1;
        if (j < len && (PyUnicode_READ(k, d, j) == '+' || PyUnicode_READ(k, d, j) == '-'))
            j++;
        if (j < len && is_digit(PyUnicode_READ(k, d, j))) {
            while (j < len && is_digit(PyUnicode_READ(k, d, j)))
                j++;
            i = j;
        }
    }
    return i;
}

static PyObject *match(PyObject *self, PyObject *args) {
    PyObject *pieces, *text;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "O!Un:match", &PyTuple_Type, &pieces, &text, &pos))
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(pieces);
    if (count < 1) {
        PyErr_SetString(PyExc_ValueError, "no pieces");
        return NULL;
    }
    for (Py_ssize_t p = 0; p < count; p++) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(pieces, p))) {
            PyErr_SetString(PyExc_TypeError, "pieces must be str");
            return NULL;
        }
        if (PyUnicode_READY(PyTuple_GET_ITEM(pieces, p)) < 0)
            return NULL;
    }
    if (PyUnicode_READY(text) < 0)
        return NULL;
    int tk = PyUnicode_KIND(text);
    const void *td = PyUnicode_DATA(text);
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    if (pos < 0 || pos > len)
        Py_RETURN_NONE;
    /* First the whole text, then the numbers' strings: a text that does not match costs no allocation. */
    Py_ssize_t stack[64];
    Py_ssize_t *spans = count - 1 <= 32 ? stack : PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)(count - 1));
    if (spans == NULL)
        return PyErr_NoMemory();
    Py_ssize_t at = pos;
    int ok = 1;
    for (Py_ssize_t p = 0; p < count && ok; p++) {
        PyObject *piece = PyTuple_GET_ITEM(pieces, p);
        Py_ssize_t n = PyUnicode_GET_LENGTH(piece);
        if (at + n > len || !same(tk, td, at, PyUnicode_KIND(piece), PyUnicode_DATA(piece), n)) {
            ok = 0;
            break;
        }
        at += n;
        if (p + 1 < count) {
            Py_ssize_t end = number_end(tk, td, at, len);
            if (end < 0) {
                ok = 0;
                break;
            }
            spans[2 * p] = at;
            spans[2 * p + 1] = end;
            at = end;
        }
    }
    PyObject *result = NULL;
    if (!ok) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *nums = PyTuple_New(count - 1);
        if (nums != NULL) {
            for (Py_ssize_t p = 0; p + 1 < count; p++) {
                PyObject *s = PyUnicode_Substring(text, spans[2 * p], spans[2 * p + 1]);
                if (s == NULL) {
                    Py_CLEAR(nums);
                    break;
                }
                PyTuple_SET_ITEM(nums, p, s);
            }
        }
        if (nums != NULL)
            result = Py_BuildValue("(Nn)", nums, at);
    }
    if (spans != stack)
        PyMem_Free(spans);
    return result;
}

static PyMethodDef methods[] = {
    {"match", match, METH_VARARGS, "match(pieces, text, pos) -> (numbers, end) or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_template", NULL, -1, methods};

PyMODINIT_FUNC PyInit__template(void) {
    PyObject *m = PyModule_Create(&def);
    if (m != NULL && PyModule_AddIntConstant(m, "API", API) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
