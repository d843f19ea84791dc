/* sclite's network alignment (SCTK net_dp.c: calculate_margin_cells, calculate_internal_cells) for
 * privasr.metrics.sclite: the same single-precision sums, the same strict comparisons in the same order, so the
 * same costs and back-pointers, ties included. The caller builds the networks (arc 0 is the null head; each
 * arc's predecessors in sclite's in-arc order, as CSR offsets and indices), the per-arc deletion and insertion
 * costs and the substitution cost of every arc pair, and reads the back-pointers to trace the path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static int get(PyObject *o, Py_buffer *v, int writable, const char *fmt, Py_ssize_t n, const char *what) {
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (v->format == NULL || v->format[0] != fmt[0] || v->format[1] != 0 || (n >= 0 && v->len / v->itemsize != n)) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd items of format '%s'", what, n, fmt);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static PyObject *align(PyObject *self, PyObject *args) {
    Py_ssize_t na, nb;
    PyObject *o[10];
    Py_buffer b[10];
    int got = 0;
    if (!PyArg_ParseTuple(args, "nnOOOOOOOOOO", &na, &nb, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &o[8], &o[9]))
        return NULL;
    if (na < 1 || nb < 1) {
        PyErr_SetString(PyExc_ValueError, "each network needs its null head");
        return NULL;
    }
    /* pa_ptr, pa_idx, pb_ptr, pb_idx (int32), cdel, cins, csub (float32), cost (float32 out), back_a, back_b (int32 out) */
    const char *fmts[10] = {"i", "i", "i", "i", "f", "f", "f", "f", "i", "i"};
    Py_ssize_t sizes[10] = {na + 1, -1, nb + 1, -1, na, nb, na * nb, na * nb, na * nb, na * nb};
    const char *names[10] = {"pa_ptr", "pa_idx", "pb_ptr", "pb_idx", "cdel", "cins", "csub", "cost", "back_a", "back_b"};
    for (; got < 10; got++)
        if (get(o[got], &b[got], got >= 7, fmts[got], sizes[got], names[got]) < 0)
            goto fail;
    const int32_t *pap = b[0].buf, *pai = b[1].buf, *pbp = b[2].buf, *pbi = b[3].buf;
    const float *cdel = b[4].buf, *cins = b[5].buf, *csub = b[6].buf;
    float *cost = b[7].buf;
    int32_t *ba = b[8].buf, *bb = b[9].buf;
    Py_ssize_t npa = b[1].len / 4, npb = b[3].len / 4;
    for (Py_ssize_t k = 0; k < na; k++)
        if (pap[k] < 0 || pap[k] > pap[k + 1] || pap[k + 1] > npa) goto bad;
    for (Py_ssize_t k = 0; k < nb; k++)
        if (pbp[k] < 0 || pbp[k] > pbp[k + 1] || pbp[k + 1] > npb) goto bad;
    for (Py_ssize_t k = 0; k < npa; k++)
        if (pai[k] < 0 || pai[k] >= na) goto bad;
    for (Py_ssize_t k = 0; k < npb; k++)
        if (pbi[k] < 0 || pbi[k] >= nb) goto bad;

    Py_BEGIN_ALLOW_THREADS
    const float big = 999999999.9;
    cost[0] = 0.0f;
    ba[0] = bb[0] = -1;
    for (Py_ssize_t j = 1; j < nb; j++) {       /* margin: insertions before any reference arc */
        float m = big;
        int32_t mi = -1;
        for (int32_t t = pbp[j]; t < pbp[j + 1]; t++)
            if (cost[pbi[t]] < m) { m = cost[pbi[t]]; mi = pbi[t]; }
        cost[j] = m + cins[j];
        ba[j] = 0;
        bb[j] = mi;
    }
    for (Py_ssize_t i = 1; i < na; i++) {       /* margin: deletions before any hypothesis arc */
        float m = big;
        int32_t mi = -1;
        for (int32_t t = pap[i]; t < pap[i + 1]; t++)
            if (cost[(Py_ssize_t)pai[t] * nb] < m) { m = cost[(Py_ssize_t)pai[t] * nb]; mi = pai[t]; }
        cost[i * nb] = m + cdel[i];
        ba[i * nb] = mi;
        bb[i * nb] = 0;
    }
    for (Py_ssize_t i = 1; i < na; i++) {
        for (Py_ssize_t j = 1; j < nb; j++) {
            float ins = big, del = big, sub = big;
            int32_t ib = -1, da = -1, sa = -1, sb = -1;
            for (int32_t t = pbp[j]; t < pbp[j + 1]; t++) {
                float c = cost[i * nb + pbi[t]];
                if (c < ins) { ins = c; ib = pbi[t]; }
            }
            for (int32_t t = pap[i]; t < pap[i + 1]; t++) {
                float c = cost[(Py_ssize_t)pai[t] * nb + j];
                if (c < del) { del = c; da = pai[t]; }
            }
            for (int32_t t = pap[i]; t < pap[i + 1]; t++)
                for (int32_t u = pbp[j]; u < pbp[j + 1]; u++) {
                    float c = cost[(Py_ssize_t)pai[t] * nb + pbi[u]];
                    if (c < sub) { sub = c; sa = pai[t]; sb = pbi[u]; }
                }
            sub += csub[i * nb + j];
            del += cdel[i];
            ins += cins[j];
            Py_ssize_t k = i * nb + j;
            if (sub <= del && sub <= ins) { cost[k] = sub; ba[k] = sa; bb[k] = sb; }
            else if (del < ins) { cost[k] = del; ba[k] = da; bb[k] = (int32_t)j; }
            else { cost[k] = ins; ba[k] = (int32_t)i; bb[k] = ib; }
        }
    }
    Py_END_ALLOW_THREADS
    for (int k = 0; k < got; k++) PyBuffer_Release(&b[k]);
    Py_RETURN_NONE;
bad:
    PyErr_SetString(PyExc_ValueError, "predecessor lists out of range");
fail:
    for (int k = 0; k < got; k++) PyBuffer_Release(&b[k]);
    return NULL;
}

static PyMethodDef methods[] = {
    {"align", align, METH_VARARGS,
     "align(na, nb, pa_ptr, pa_idx, pb_ptr, pb_idx, cdel, cins, csub, cost, back_a, back_b): sclite's network DP."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_netdp", "sclite's network alignment DP.", -1, methods};

PyMODINIT_FUNC PyInit__netdp(void) { return PyModule_Create(&module); }
