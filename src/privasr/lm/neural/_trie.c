/* The prefix trie of privasr.lm.neural.trie and the layout the scorer feeds a Transformer, in compiled loops.
 *
 * trie.py holds the reference implementations (pure Python and numpy) and calls these where this module is built;
 * tests/lm/neural/test_trie.py checks that both give the same arrays, element for element. The functions are:
 *
 *   build     the trie of a set of token sequences given as one flat array and offsets (PrefixTrie.build);
 *   lex_order the sequences' lexicographic order (lex_order);
 *   segments  the cut of a trie into ancestor-closed segments of bounded length (PrefixTrie.segments);
 *   pack      the best-fit packing of segments into rows (pack_rows);
 *   attention the tree attention mask of packed rows (PackedRows.attention);
 *   pairs     the distinct (context node, target) pairs of scored sequences and each target's pair (scorer.py).
 *
 * Arrays come in through the buffer protocol (int64, C order); outputs of known size are buffers the caller
 * allocates, outputs of unknown size are returned as bytes objects the caller views with numpy.frombuffer.
 * trie.py checks the arguments' shapes and values; the checks here only keep every index in bounds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Py_buffer view;
    int held;
} buf_t;

/* obj's buffer, C-contiguous, of items of itemsize bytes whose format is one of the characters in fmts */
static int get_buf(PyObject *obj, buf_t *b, int writable, const char *name, Py_ssize_t itemsize, const char *fmts,
                   const char *what) {
    b->held = 0;
    if (PyObject_GetBuffer(obj, &b->view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s buffer", name, writable ? " writable" : "");
        return -1;
    }
    b->held = 1;
    const char *f = b->view.format;
    if (b->view.itemsize != itemsize || f == NULL || f[0] == '\0' || !strchr(fmts, f[0]) || f[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "%s must hold %s", name, what);
        return -1;
    }
    return 0;
}

static int get_i64(PyObject *obj, buf_t *b, int writable, const char *name) {
    return get_buf(obj, b, writable, name, 8, "ql", "int64");
}

static int get_u8(PyObject *obj, buf_t *b, const char *name) {
    return get_buf(obj, b, 1, name, 1, "?B", "bool or uint8");
}

static void release(buf_t *bufs, int n) {
    for (int k = 0; k < n; k++)
        if (bufs[k].held) PyBuffer_Release(&bufs[k].view);
}

#define LEN(b) ((b).view.len / 8)
#define I64(b) ((int64_t *)(b).view.buf)

/* ---- build ------------------------------------------------------------------------------------------------ */

typedef struct {
    const int64_t *tok, *off;
} seqs_t;

/* lexicographic order of sequences a and b; ties (equal sequences) by index, so the sort is deterministic */
static int seq_cmp(const seqs_t *s, int64_t a, int64_t b) {
    const int64_t *x = s->tok + s->off[a], *y = s->tok + s->off[b];
    int64_t na = s->off[a + 1] - s->off[a], nb = s->off[b + 1] - s->off[b], n = na < nb ? na : nb;
    for (int64_t k = 0; k < n; k++)
        if (x[k] != y[k]) return x[k] < y[k] ? -1 : 1;
    if (na != nb) return na < nb ? -1 : 1;
    return a < b ? -1 : (a > b);
}

static void merge_sort(const seqs_t *s, int64_t *idx, int64_t *tmp, int64_t n) {
    if (n < 2) return;
    if (n <= 16) { /* insertion sort */
        for (int64_t i = 1; i < n; i++) {
            int64_t v = idx[i], j = i;
            while (j > 0 && seq_cmp(s, idx[j - 1], v) > 0) {
                idx[j] = idx[j - 1];
                j--;
            }
            idx[j] = v;
        }
        return;
    }
    int64_t h = n / 2;
    merge_sort(s, idx, tmp, h);
    merge_sort(s, idx + h, tmp, n - h);
    int64_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = seq_cmp(s, idx[i], idx[j]) <= 0 ? idx[i++] : idx[j++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, (size_t)n * sizeof(int64_t));
}

static PyObject *build(PyObject *self, PyObject *args) {
    PyObject *o[9];
    long long root_token;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOLOOOOOO", &o[0], &o[1], &root_token, &o[2], &o[3], &o[4], &o[5], &o[6], &o[7]))
        return NULL;
    static const char *names[] = {"tokens", "offsets", "parent", "token", "depth", "size", "ends", "paths"};
    buf_t b[8];
    memset(b, 0, sizeof(b));
    for (int k = 0; k < 8; k++)
        if (get_i64(o[k], &b[k], k >= 2, names[k]) < 0) {
            release(b, 8);
            return NULL;
        }
    const int64_t *tok = I64(b[0]), *off = I64(b[1]);
    int64_t t = LEN(b[0]), s = LEN(b[1]) - 1;
    if (s < 0 || off[0] != 0 || off[s] != t) {
        PyErr_SetString(PyExc_ValueError, "offsets must start at 0 and end at len(tokens)");
        release(b, 8);
        return NULL;
    }
    int64_t maxlen = 0;
    for (int64_t i = 0; i < s; i++) {
        int64_t n = off[i + 1] - off[i];
        if (n < 0) {
            PyErr_SetString(PyExc_ValueError, "offsets must not decrease");
            release(b, 8);
            return NULL;
        }
        if (n > maxlen) maxlen = n;
    }
    if (LEN(b[2]) < t + 1 || LEN(b[3]) < t + 1 || LEN(b[4]) < t + 1 || LEN(b[5]) < t + 1 || LEN(b[6]) != s ||
        LEN(b[7]) != t + s) {
        PyErr_SetString(PyExc_ValueError, "parent, token, depth and size need len(tokens) + 1 entries, ends one per "
                                          "sequence, paths len(tokens) + len(sequences)");
        release(b, 8);
        return NULL;
    }
    int64_t *parent = I64(b[2]), *token = I64(b[3]), *depth = I64(b[4]), *size = I64(b[5]), *ends = I64(b[6]),
            *paths = I64(b[7]);
    int64_t *idx = malloc((size_t)(s > 0 ? s : 1) * sizeof(int64_t));
    int64_t *tmp = malloc((size_t)(s > 0 ? s : 1) * sizeof(int64_t));
    int64_t *path = malloc((size_t)(maxlen + 1) * sizeof(int64_t));
    if (!idx || !tmp || !path) {
        free(idx);
        free(tmp);
        free(path);
        release(b, 8);
        return PyErr_NoMemory();
    }
    int64_t nn = 0;
    Py_BEGIN_ALLOW_THREADS
    seqs_t sq = {tok, off};
    for (int64_t i = 0; i < s; i++) idx[i] = i;
    merge_sort(&sq, idx, tmp, s);
    parent[0] = -1;
    token[0] = root_token;
    depth[0] = 0;
    nn = 1;
    int64_t plen = 1; /* path[0 .. plen-1]: the nodes of the previous sequence's prefixes */
    path[0] = 0;
    int64_t prev = -1;
    for (int64_t k = 0; k < s; k++) {
        int64_t i = idx[k];
        const int64_t *x = tok + off[i];
        int64_t n = off[i + 1] - off[i], lcp = 0;
        if (prev >= 0) {
            const int64_t *y = tok + off[prev];
            int64_t m = off[prev + 1] - off[prev];
            int64_t lim = m < n ? m : n;
            while (lcp < lim && x[lcp] == y[lcp]) lcp++;
        }
        while (plen > lcp + 1) { /* the previous path's nodes below the common prefix: their subtrees are done */
            int64_t p = path[--plen];
            size[p] = nn - p;
        }
        for (int64_t j = lcp; j < n; j++) {
            parent[nn] = path[plen - 1];
            token[nn] = x[j];
            depth[nn] = plen;
            path[plen++] = nn++;
        }
        ends[i] = path[plen - 1];
        prev = i;
    }
    while (plen > 0) {
        int64_t p = path[--plen];
        size[p] = nn - p;
    }
    for (int64_t i = 0; i < s; i++) { /* each sequence's path, from its end up */
        int64_t n = off[i + 1] - off[i], node = ends[i];
        int64_t *dst = paths + off[i] + i;
        for (int64_t d = n; d >= 0; d--) {
            dst[d] = node;
            node = parent[node];
        }
    }
    Py_END_ALLOW_THREADS
    free(idx);
    free(tmp);
    free(path);
    release(b, 8);
    return PyLong_FromLongLong(nn);
}

/* lex_order(tokens, offsets, out): the sequences' indices in lexicographic order (ties by index) */
static PyObject *lex_order(PyObject *self, PyObject *args) {
    PyObject *o[3];
    (void)self;
    if (!PyArg_ParseTuple(args, "OOO", &o[0], &o[1], &o[2])) return NULL;
    static const char *names[] = {"tokens", "offsets", "out"};
    buf_t b[3];
    memset(b, 0, sizeof(b));
    for (int k = 0; k < 3; k++)
        if (get_i64(o[k], &b[k], k == 2, names[k]) < 0) {
            release(b, 3);
            return NULL;
        }
    const int64_t *off = I64(b[1]);
    int64_t t = LEN(b[0]), s = LEN(b[1]) - 1;
    int bad = s < 0 || off[0] != 0 || off[s] != t || LEN(b[2]) != s;
    for (int64_t i = 0; !bad && i < s; i++) bad = off[i + 1] < off[i];
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "offsets must run from 0 to len(tokens) and out hold one index per sequence");
        release(b, 3);
        return NULL;
    }
    int64_t *idx = I64(b[2]), *tmp = malloc((size_t)(s > 0 ? s : 1) * sizeof(int64_t));
    if (!tmp) {
        release(b, 3);
        return PyErr_NoMemory();
    }
    seqs_t sq = {I64(b[0]), off};
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 0; i < s; i++) idx[i] = i;
    merge_sort(&sq, idx, tmp, s);
    Py_END_ALLOW_THREADS
    free(tmp);
    release(b, 3);
    Py_RETURN_NONE;
}

/* ---- best fit --------------------------------------------------------------------------------------------- */

typedef struct {
    int64_t size, index;
} item_t;

static int item_cmp(const void *a, const void *b) {
    const item_t *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1; /* largest first */
    return x->index < y->index ? -1 : (x->index > y->index);  /* ties in input order */
}

/* trie.best_fit: bin[i] = the bin of item i (bins numbered in the order they are opened); returns the number of
 * bins, or -1 when out of memory. Each item, largest first, goes into the bin with the least room it fits in
 * (ties: the lowest bin), else a new bin. All sizes must be in 1 .. capacity. */
static int64_t best_fit(const int64_t *sizes, int64_t n, int64_t capacity, int64_t *bin) {
    item_t *items = malloc((size_t)(n > 0 ? n : 1) * sizeof(item_t));
    int64_t *room = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!items || !room) {
        free(items);
        free(room);
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        items[i].size = sizes[i];
        items[i].index = i;
    }
    qsort(items, (size_t)n, sizeof(item_t), item_cmp);
    int64_t nb = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t sz = items[k].size, best = -1;
        for (int64_t j = 0; j < nb; j++)
            if (room[j] >= sz && (best < 0 || room[j] < room[best])) best = j;
        if (best < 0) {
            best = nb;
            room[nb++] = capacity;
        }
        room[best] -= sz;
        bin[items[k].index] = best;
    }
    free(items);
    free(room);
    return nb;
}

/* ---- growable int64 arrays, handed back as bytes -------------------------------------------------------- */

typedef struct {
    int64_t *a;
    int64_t n, cap;
} vec_t;

static int vec_push(vec_t *v, int64_t x) {
    if (v->n == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 256;
        int64_t *a = realloc(v->a, (size_t)cap * sizeof(int64_t));
        if (!a) return -1;
        v->a = a;
        v->cap = cap;
    }
    v->a[v->n++] = x;
    return 0;
}

static PyObject *vec_bytes(vec_t *v) {
    return PyBytes_FromStringAndSize((const char *)v->a, (Py_ssize_t)(v->n * (int64_t)sizeof(int64_t)));
}

/* ---- segments --------------------------------------------------------------------------------------------- */

/* PrefixTrie.segments for a trie too large for one segment: returns (flat nodes, offsets) as int64 bytes. */
static PyObject *segments(PyObject *self, PyObject *args) {
    PyObject *po, *so, *dop;
    long long max_len;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOL", &po, &so, &dop, &max_len)) return NULL;
    buf_t b[3];
    memset(b, 0, sizeof(b));
    if (get_i64(po, &b[0], 0, "parent") < 0 || get_i64(so, &b[1], 0, "size") < 0 ||
        get_i64(dop, &b[2], 0, "depth") < 0) {
        release(b, 3);
        return NULL;
    }
    int64_t n = LEN(b[0]);
    const int64_t *parent = I64(b[0]), *size = I64(b[1]), *depth = I64(b[2]);
    if (LEN(b[1]) != n || LEN(b[2]) != n || n == 0) {
        PyErr_SetString(PyExc_ValueError, "parent, size and depth must be non-empty and of one length");
        release(b, 3);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        if (depth[i] + 1 > max_len || size[i] < 1 || i + size[i] > n || (i > 0 && (parent[i] < 0 || parent[i] >= i))) {
            PyErr_SetString(PyExc_ValueError, "not a preorder trie whose paths fit max_len");
            release(b, 3);
            return NULL;
        }
    vec_t out = {0}, offs = {0}, todo = {0}, kids = {0}, fit = {0}, fsz = {0};
    int64_t *bin = NULL, *anc = malloc((size_t)max_len * sizeof(int64_t));
    int ok = anc && vec_push(&offs, 0) == 0 && vec_push(&todo, 0) == 0;
    while (ok && todo.n) {
        int64_t node = todo.a[--todo.n];
        /* the path from the root to node */
        int64_t na = depth[node] + 1, a = node;
        for (int64_t d = na - 1; d >= 0; d--) {
            anc[d] = a;
            a = parent[a];
        }
        kids.n = fit.n = fsz.n = 0;
        for (int64_t c = node + 1; ok && c < node + size[node]; c += size[c]) ok = vec_push(&kids, c) == 0;
        int64_t room = max_len - na;
        for (int64_t k = 0; ok && k < kids.n; k++)
            if (size[kids.a[k]] <= room) ok = vec_push(&fit, kids.a[k]) == 0 && vec_push(&fsz, size[kids.a[k]]) == 0;
        if (!ok) break;
        free(bin);
        bin = malloc((size_t)(fit.n > 0 ? fit.n : 1) * sizeof(int64_t));
        int64_t nb = bin ? best_fit(fsz.a, fit.n, room, bin) : -1;
        if (nb < 0) {
            ok = 0;
            break;
        }
        for (int64_t g = 0; ok && g < nb; g++) { /* a segment per bin: the path, then its subtrees in node order */
            for (int64_t d = 0; ok && d < na; d++) ok = vec_push(&out, anc[d]) == 0;
            for (int64_t k = 0; ok && k < fit.n; k++)
                if (bin[k] == g)
                    for (int64_t c = fit.a[k]; ok && c < fit.a[k] + size[fit.a[k]]; c++) ok = vec_push(&out, c) == 0;
            ok = ok && vec_push(&offs, out.n) == 0;
        }
        for (int64_t k = kids.n - 1; ok && k >= 0; k--) /* too large: split one level down, first child first */
            if (size[kids.a[k]] > room) ok = vec_push(&todo, kids.a[k]) == 0;
    }
    PyObject *res = NULL;
    if (!ok) {
        PyErr_NoMemory();
    } else {
        PyObject *x = vec_bytes(&out), *y = vec_bytes(&offs);
        if (x && y) res = PyTuple_Pack(2, x, y);
        Py_XDECREF(x);
        Py_XDECREF(y);
    }
    free(out.a);
    free(offs.a);
    free(todo.a);
    free(kids.a);
    free(fit.a);
    free(fsz.a);
    free(bin);
    free(anc);
    release(b, 3);
    return res;
}

/* ---- pack ------------------------------------------------------------------------------------------------- */

/* pack_rows: (rows, nodes, parent_pos, own as uint8, positions) with the arrays as bytes of rows x row_len. */
static PyObject *pack(PyObject *self, PyObject *args) {
    PyObject *po, *dop, *fo, *oo;
    long long row_len;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOL", &po, &dop, &fo, &oo, &row_len)) return NULL;
    buf_t b[4];
    memset(b, 0, sizeof(b));
    if (get_i64(po, &b[0], 0, "parent") < 0 || get_i64(dop, &b[1], 0, "depth") < 0 ||
        get_i64(fo, &b[2], 0, "flat") < 0 || get_i64(oo, &b[3], 0, "offsets") < 0) {
        release(b, 4);
        return NULL;
    }
    int64_t n = LEN(b[0]), nf = LEN(b[2]), ns = LEN(b[3]) - 1;
    const int64_t *parent = I64(b[0]), *depth = I64(b[1]), *flat = I64(b[2]), *off = I64(b[3]);
    const char *err = NULL;
    if (LEN(b[1]) != n || ns < 0 || off[0] != 0 || off[ns] != nf || row_len < 1) err = "bad trie or segments";
    for (int64_t k = 0; !err && k < ns; k++)
        if (off[k + 1] < off[k] || off[k + 1] - off[k] > row_len) err = "a segment does not fit a row";
    for (int64_t k = 0; !err && k < nf; k++)
        if (flat[k] < 0 || flat[k] >= n) err = "a segment holds a node outside the trie";
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
        release(b, 4);
        return NULL;
    }
    int64_t *lens = malloc((size_t)(ns > 0 ? ns : 1) * sizeof(int64_t));
    int64_t *bin = malloc((size_t)(ns > 0 ? ns : 1) * sizeof(int64_t));
    int64_t *where = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    int64_t *fill = NULL;
    PyObject *nodes_b = NULL, *pp_b = NULL, *own_b = NULL, *pos_b = NULL, *res = NULL;
    int64_t rows = -1;
    if (lens && bin && where) {
        for (int64_t k = 0; k < ns; k++) lens[k] = off[k + 1] - off[k];
        rows = best_fit(lens, ns, row_len, bin);
    }
    if (rows < 0 || !(fill = calloc((size_t)(rows > 0 ? rows : 1), sizeof(int64_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t total = rows * row_len;
    nodes_b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total * 8));
    pp_b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total * 8));
    own_b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    pos_b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total * 8));
    if (!nodes_b || !pp_b || !own_b || !pos_b) goto done;
    int64_t *nodes = (int64_t *)PyBytes_AS_STRING(nodes_b), *pp = (int64_t *)PyBytes_AS_STRING(pp_b),
            *pos = (int64_t *)PyBytes_AS_STRING(pos_b);
    uint8_t *own = (uint8_t *)PyBytes_AS_STRING(own_b);
    for (int64_t k = 0; k < total; k++) {
        nodes[k] = -1;
        pp[k] = -1;
        pos[k] = 0;
        own[k] = 0;
    }
    for (int64_t i = 0; i < n; i++) where[i] = -1;
    /* segments in input order: within a row they come in increasing segment index, as sorted(bin) does */
    for (int64_t k = 0; k < ns && !err; k++) {
        int64_t r = bin[k], o = fill[r], *rn = nodes + r * row_len, *rp = pp + r * row_len;
        for (int64_t j = 0; j < lens[k]; j++) {
            int64_t node = flat[off[k] + j], par = parent[node];
            int64_t at = par >= 0 ? where[par] : -1;
            if ((par >= 0) != (at >= 0)) {
                err = "a segment is not closed under ancestors (or lists a child before its parent)";
                break;
            }
            where[node] = o + j;
            rn[o + j] = node;
            rp[o + j] = at;
        }
        for (int64_t j = 0; j < lens[k]; j++) where[flat[off[k] + j]] = -1;
        fill[r] += lens[k];
    }
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
        goto done;
    }
    for (int64_t i = 0; i < n; i++) where[i] = 0; /* now: whether the node's owner is already chosen */
    for (int64_t k = 0; k < total; k++)
        if (nodes[k] >= 0) {
            pos[k] = depth[nodes[k]];
            if (!where[nodes[k]]) {
                where[nodes[k]] = 1;
                own[k] = 1;
            }
        }
    res = Py_BuildValue("LOOOO", (long long)rows, nodes_b, pp_b, own_b, pos_b);
done:
    Py_XDECREF(nodes_b);
    Py_XDECREF(pp_b);
    Py_XDECREF(own_b);
    Py_XDECREF(pos_b);
    free(lens);
    free(bin);
    free(where);
    free(fill);
    release(b, 4);
    return res;
}

/* ---- attention -------------------------------------------------------------------------------------------- */

static PyObject *attention(PyObject *self, PyObject *args) {
    PyObject *po, *mo;
    Py_ssize_t length;
    (void)self;
    if (!PyArg_ParseTuple(args, "OnO", &po, &length, &mo)) return NULL;
    buf_t b[2];
    memset(b, 0, sizeof(b));
    if (get_i64(po, &b[0], 0, "parent_pos") < 0 || get_u8(mo, &b[1], "mask") < 0) {
        release(b, 2);
        return NULL;
    }
    int64_t total = LEN(b[0]);
    if (length < 1 || total % length || b[1].view.len != total * length) {
        PyErr_SetString(PyExc_ValueError, "parent_pos must be rows x length and mask rows x length x length");
        release(b, 2);
        return NULL;
    }
    const int64_t *pp = I64(b[0]);
    for (int64_t k = 0; k < total; k++)
        if (pp[k] >= length || pp[k] >= k % length) {
            PyErr_SetString(PyExc_ValueError, "a parent position is not before its child in the row");
            release(b, 2);
            return NULL;
        }
    uint8_t *mask = (uint8_t *)b[1].view.buf;
    Py_BEGIN_ALLOW_THREADS
    /* a position's row is its parent's row (complete: the parent comes first) plus itself */
    for (int64_t k = 0; k < total; k++) {
        int64_t r = k / length, i = k % length, p = pp[k];
        uint8_t *row = mask + k * length;
        if (p >= 0)
            memcpy(row, mask + (r * length + p) * length, (size_t)length);
        else
            memset(row, 0, (size_t)length);
        row[i] = 1;
    }
    Py_END_ALLOW_THREADS
    release(b, 2);
    Py_RETURN_NONE;
}

/* ---- pairs ------------------------------------------------------------------------------------------------ */

typedef struct {
    int64_t node, target, seq;
} final_t;

static int final_cmp(const void *a, const void *b) {
    const final_t *x = a, *y = b;
    if (x->node != y->node) return x->node < y->node ? -1 : 1;
    if (x->target != y->target) return x->target < y->target ? -1 : 1;
    return x->seq < y->seq ? -1 : (x->seq > y->seq);
}

/* The distinct (context node, target) pairs of scored sequences, grouped by node in increasing node order.
 * Sequence i's contexts are its path paths[off[i] + i .. off[i+1] + i] (its prefixes of length 0 .. n_i, n_i =
 * off[i+1] - off[i]); its targets are the tokens of those prefixes' children along the path, then final[i] after
 * the whole prefix. A child's target is the edge (parent, token) of that child; a final target is the child edge
 * with that token if the end node has one, else a pair of its own. Writes pnode and ptarget (capacity: len(size)
 * + number of sequences) and, for every target, its pair (tokpair, laid out like paths); returns the number of
 * pairs. */
static PyObject *pairs(PyObject *self, PyObject *args) {
    PyObject *o[8];
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7])) return NULL;
    static const char *names[] = {"size", "token", "paths", "offsets", "final", "pnode", "ptarget", "tokpair"};
    buf_t b[8];
    memset(b, 0, sizeof(b));
    for (int k = 0; k < 8; k++)
        if (get_i64(o[k], &b[k], k >= 5, names[k]) < 0) {
            release(b, 8);
            return NULL;
        }
    const int64_t *size = I64(b[0]), *token = I64(b[1]), *paths = I64(b[2]), *off = I64(b[3]), *fin = I64(b[4]);
    int64_t *pnode = I64(b[5]), *ptgt = I64(b[6]), *tokpair = I64(b[7]);
    int64_t n = LEN(b[0]), s = LEN(b[3]) - 1, np_ = LEN(b[2]);
    const char *err = NULL;
    if (LEN(b[1]) != n || s < 0 || LEN(b[4]) != s || LEN(b[5]) < n + s || LEN(b[6]) < n + s || LEN(b[7]) != np_ ||
        off[0] != 0 || off[s] + s != np_)
        err = "inconsistent trie, paths, offsets or outputs";
    for (int64_t i = 0; !err && i < s; i++)
        if (off[i + 1] < off[i]) err = "offsets must not decrease";
    for (int64_t k = 0; !err && k < np_; k++)
        if (paths[k] < 0 || paths[k] >= n) err = "a path holds a node outside the trie";
    for (int64_t i = 0; !err && i < n; i++)
        if (size[i] < 1 || i + size[i] > n) err = "not a preorder trie";
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
        release(b, 8);
        return NULL;
    }
    int64_t *child_pair = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    int64_t *fin_pair = malloc((size_t)(s > 0 ? s : 1) * sizeof(int64_t));
    final_t *extra = malloc((size_t)(s > 0 ? s : 1) * sizeof(final_t));
    if (!child_pair || !fin_pair || !extra) {
        free(child_pair);
        free(fin_pair);
        free(extra);
        release(b, 8);
        return PyErr_NoMemory();
    }
    int64_t ne = 0, np = 0;
    Py_BEGIN_ALLOW_THREADS
    /* final targets: a child edge of the end node (marked -2 - child), or an extra pair (sorted below) */
    for (int64_t i = 0; i < s; i++) {
        int64_t e = paths[off[i + 1] + i], f = fin[i], hit = -1;
        for (int64_t c = e + 1; c < e + size[e]; c += size[c])
            if (token[c] == f) {
                hit = c;
                break;
            }
        if (hit >= 0) {
            fin_pair[i] = -2 - hit;
        } else {
            extra[ne].node = e;
            extra[ne].target = f;
            extra[ne].seq = i;
            ne++;
        }
    }
    qsort(extra, (size_t)ne, sizeof(final_t), final_cmp);
    int64_t k = 0;
    for (int64_t v = 0; v < n; v++) {
        for (int64_t c = v + 1; c < v + size[v]; c += size[c]) {
            child_pair[c] = np;
            pnode[np] = v;
            ptgt[np++] = token[c];
        }
        for (; k < ne && extra[k].node == v; k++) {
            if (k == 0 || extra[k - 1].node != v || extra[k - 1].target != extra[k].target) {
                pnode[np] = v;
                ptgt[np++] = extra[k].target;
            }
            fin_pair[extra[k].seq] = np - 1;
        }
    }
    for (int64_t i = 0; i < s; i++) {
        const int64_t *p = paths + off[i] + i;
        int64_t m = off[i + 1] - off[i];
        int64_t *dst = tokpair + off[i] + i;
        for (int64_t j = 0; j < m; j++) dst[j] = child_pair[p[j + 1]];
        dst[m] = fin_pair[i] <= -2 ? child_pair[-2 - fin_pair[i]] : fin_pair[i];
    }
    Py_END_ALLOW_THREADS
    free(child_pair);
    free(fin_pair);
    free(extra);
    release(b, 8);
    return PyLong_FromLongLong(np);
}

static PyMethodDef methods[] = {
    {"build", build, METH_VARARGS,
     "build(tokens, offsets, root_token, parent, token, depth, size, ends, paths) -> number of nodes"},
    {"lex_order", lex_order, METH_VARARGS, "lex_order(tokens, offsets, out) -> None"},
    {"segments", segments, METH_VARARGS, "segments(parent, size, depth, max_len) -> (flat bytes, offsets bytes)"},
    {"pack", pack, METH_VARARGS,
     "pack(parent, depth, flat, offsets, row_len) -> (rows, nodes, parent_pos, own, positions) as bytes"},
    {"attention", attention, METH_VARARGS, "attention(parent_pos, length, mask) -> None"},
    {"pairs", pairs, METH_VARARGS,
     "pairs(size, token, paths, offsets, final, pnode, ptarget, tokpair) -> number of pairs"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_trie",
                                    "Compiled prefix tries and Transformer row packing for neural-LM scoring.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__trie(void) { return PyModule_Create(&module); }
