/* The compiled query engine of privasr.lm.ngram.model.NgramModel.
 *
 * An Engine holds, for every order n >= 2, an open-addressing hash table (linear probing, Fibonacci hashing,
 * two slots per n-gram) from the model's n-gram keys (row of the (n-1)-gram prefix * (V + 1) + last word id) to
 * their row, probability and backoff, so that a listed n-gram costs one memory access; the unigram values are
 * read from the model's own arrays (read-only numpy arrays, held through the buffer protocol). A token's lookups
 * of all orders are independent (each needs the previous token's rows), so their loads are prefetched together;
 * tables of 2 MiB and more ask the kernel for huge pages (random probes otherwise miss the TLB). Token lists are
 * scored straight from Python objects, word ids coming from the model's word -> id dict: a batch is one call.
 *
 * The arithmetic is the numpy path's, operation for operation (NgramModel._score_flat for sentences,
 * NgramModel._logprob_ids / _truncate for advance), so both give the same float64 results; the numpy path stays
 * as the fallback where this module is not built and as the tests' oracle.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

typedef struct {
    int64_t key; /* -1: empty */
    int64_t row;
    double prob, bow; /* copies of the model's values, so that a hit costs one memory access */
} Slot;

typedef struct {
    Slot *slots;
    uint64_t size;
} Table;

typedef struct {
    PyObject_HEAD
    PyObject *ids;      /* dict: word -> id */
    int order;
    int64_t v, mult, unk, bos;
    Py_buffer *prob;    /* order buffers, float64 */
    Py_buffer *bow;     /* order buffers, float64 */
    Table *tables;      /* tables[n - 1] for n >= 2 */
    int ready;          /* set once __init__ has succeeded */
} Engine;

static int check_ready(const Engine *self) {
    if (!self->ready) PyErr_SetString(PyExc_RuntimeError, "the Engine is not initialised");
    return self->ready;
}

#define MAX_ORDER 63 /* rows of the n-grams ending at a token live on the stack */
#ifndef SLOTS_PER_NGRAM
#define SLOTS_PER_NGRAM 2.0 /* load 1/2: a missing n-gram (the common case) ends its probe within a cache line or two */
#endif

#define HUGE_PAGE ((size_t)2 << 20)

static const uint64_t FIB = 0x9E3779B97F4A7C15ULL;

static inline uint64_t home(const Table *t, int64_t key) {
    /* Fibonacci hashing, then the high half of a 64x64-bit product maps it onto [0, size) */
    return (uint64_t)(((unsigned __int128)((uint64_t)key * FIB) * t->size) >> 64);
}

/* The slot of key, probing from pos (its home), or NULL. */
static inline const Slot *table_find_from(const Table *t, int64_t key, uint64_t pos) {
    for (;;) {
        const Slot *s = &t->slots[pos];
        if (s->key == key) return s;
        if (s->key < 0) return NULL;
        if (++pos == t->size) pos = 0;
    }
}

static inline const Slot *table_find(const Table *t, int64_t key) { return table_find_from(t, key, home(t, key)); }

static int table_build(Table *t, const int64_t *keys, const double *prob, const double *bow, Py_ssize_t n) {
    t->size = (uint64_t)(n * SLOTS_PER_NGRAM) + 8;
    size_t bytes = t->size * sizeof(Slot);
    void *mem = NULL;
    /* probes land on random pages: 2 MiB pages (where the kernel grants them) spare most TLB misses */
    if (bytes >= HUGE_PAGE && posix_memalign(&mem, HUGE_PAGE, bytes) == 0) {
#if defined(MADV_HUGEPAGE)
        madvise(mem, bytes, MADV_HUGEPAGE);
#endif
    } else {
        mem = malloc(bytes);
    }
    t->slots = mem;
    if (!t->slots) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t i = 0; i < t->size; i++) t->slots[i].key = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t pos = home(t, keys[i]);
        while (t->slots[pos].key >= 0)
            if (++pos == t->size) pos = 0;
        t->slots[pos] = (Slot){keys[i], i, prob[i], bow[i]};
    }
    return 0;
}

static void Engine_dealloc(Engine *self) {
    for (int n = 0; n < self->order; n++) {
        if (self->prob && self->prob[n].obj) PyBuffer_Release(&self->prob[n]);
        if (self->bow && self->bow[n].obj) PyBuffer_Release(&self->bow[n]);
    }
    if (self->tables) {
        for (int n = 0; n < self->order; n++) free(self->tables[n].slots);
    }
    PyMem_Free(self->prob);
    PyMem_Free(self->bow);
    PyMem_Free(self->tables);
    Py_XDECREF(self->ids);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int get_buffer(PyObject *obj, Py_buffer *view, char kind, const char *what, int n) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    int ok = view->itemsize == 8 && view->ndim == 1 &&
             (kind == 'd' ? strcmp(f, "d") == 0 : (strcmp(f, "l") == 0 || strcmp(f, "q") == 0));
    if (!ok) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "order %d %s: expected a 1-d %s array", n + 1, what,
                     kind == 'd' ? "float64" : "int64");
        return -1;
    }
    return 0;
}

/* Engine(ids, keys, probs, bows, unk, bos): ids is the word -> id dict, keys/probs/bows one array per order
 * (the model's), unk and bos the ids of <unk> and <s> (-1 when absent). */
static int Engine_init(Engine *self, PyObject *args, PyObject *kwds) {
    PyObject *ids, *keys, *probs, *bows;
    long long unk, bos;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Engine takes positional arguments only");
        return -1;
    }
    if (self->prob) {
        PyErr_SetString(PyExc_RuntimeError, "Engine is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O!OOOLL", &PyDict_Type, &ids, &keys, &probs, &bows, &unk, &bos)) return -1;
    Py_ssize_t order = PySequence_Size(probs);
    if (order < 1 || PySequence_Size(keys) != order || PySequence_Size(bows) != order) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "keys, probs and bows need one array per order");
        return -1;
    }
    if (order > MAX_ORDER) {
        PyErr_Format(PyExc_ValueError, "orders up to %d are supported", MAX_ORDER);
        return -1;
    }
    self->order = (int)order;
    self->prob = PyMem_Calloc(order, sizeof(Py_buffer));
    self->bow = PyMem_Calloc(order, sizeof(Py_buffer));
    self->tables = PyMem_Calloc(order, sizeof(Table));
    if (!self->prob || !self->bow || !self->tables) {
        PyErr_NoMemory();
        return -1;
    }
    Py_INCREF(ids);
    self->ids = ids;
    self->unk = unk;
    self->bos = bos;
    for (int n = 0; n < order; n++) {
        PyObject *p = PySequence_GetItem(probs, n), *b = PySequence_GetItem(bows, n);
        int bad = !p || !b || get_buffer(p, &self->prob[n], 'd', "probs", n) < 0 ||
                  get_buffer(b, &self->bow[n], 'd', "bows", n) < 0;
        Py_XDECREF(p);
        Py_XDECREF(b);
        if (bad) return -1;
        if (self->bow[n].len != self->prob[n].len) {
            PyErr_Format(PyExc_ValueError, "order %d: probs and bows differ in length", n + 1);
            return -1;
        }
    }
    self->v = self->prob[0].len / 8;
    self->mult = self->v + 1;
    for (int n = 1; n < order; n++) {
        PyObject *k = PySequence_GetItem(keys, n);
        Py_buffer kb;
        if (!k) return -1;
        int bad = get_buffer(k, &kb, 'l', "keys", n) < 0;
        Py_DECREF(k);
        if (bad) return -1;
        if (kb.len != self->prob[n].len) {
            PyBuffer_Release(&kb);
            PyErr_Format(PyExc_ValueError, "order %d: keys and probs differ in length", n + 1);
            return -1;
        }
        int rc = table_build(&self->tables[n], (const int64_t *)kb.buf, (const double *)self->prob[n].buf,
                             (const double *)self->bow[n].buf, kb.len / 8);
        PyBuffer_Release(&kb);
        if (rc < 0) return -1;
    }
    self->ready = 1;
    return 0;
}

/* The id of a word: the dict's, else <unk>'s, else the sentinel v (matches nothing); *missing says which. */
static inline int word_id(Engine *self, PyObject *word, int64_t *id, int *missing) {
    PyObject *val = PyDict_GetItemWithError(self->ids, word);
    if (val) {
        *id = PyLong_AsLongLong(val);
        if (*id == -1 && PyErr_Occurred()) return -1;
        *missing = 0;
        return 0;
    }
    if (PyErr_Occurred()) return -1;
    *missing = 1;
    *id = self->unk >= 0 ? self->unk : self->v;
    return 0;
}

/* The n-gram of one order ending at a token: its row (-1: not listed) and its backoff weight. */
typedef struct {
    int64_t row;
    double bow;
} Hit;

/* Score one token after the n-grams in prev (pos = earlier tokens in the sentence); fills cur. */
static inline double step(const Engine *self, int64_t id, Py_ssize_t pos, const Hit *prev, Hit *cur) {
    const int order = self->order;
    const int valid = id >= 0 && id < self->v;
    int nstar = 0;
    double p = -INFINITY;
    int64_t keys[MAX_ORDER];   /* the key to look up per order, -1: none (no context, or an unknown word) */
    uint64_t homes[MAX_ORDER];
    if (valid) {
        cur[0] = (Hit){id, ((const double *)self->bow[0].buf)[id]};
        p = ((const double *)self->prob[0].buf)[id];
        nstar = 1;
    } else {
        cur[0] = (Hit){-1, 0.0};
    }
    /* the lookups of all orders are independent: start their memory loads together, then probe */
    for (int n = 1; n < order; n++) {
        keys[n] = valid && pos >= n && prev[n - 1].row >= 0 ? prev[n - 1].row * self->mult + id : -1;
        homes[n] = keys[n] >= 0 ? home(&self->tables[n], keys[n]) : 0;
        if (keys[n] >= 0) __builtin_prefetch(&self->tables[n].slots[homes[n]]);
    }
    for (int n = 1; n < order; n++) {
        const Slot *s = keys[n] >= 0 ? table_find_from(&self->tables[n], keys[n], homes[n]) : NULL;
        if (s) {
            cur[n] = (Hit){s->row, s->bow};
            p = s->prob;
            nstar = n + 1;
        } else {
            cur[n] = (Hit){-1, 0.0};
        }
    }
    double lp = p;
    if (nstar) {
        for (int m = 1; m < order; m++)
            if (pos >= m && m >= nstar && prev[m - 1].row >= 0) lp += prev[m - 1].bow;
    }
    return lp;
}

static int get_out(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t need, const char *what) {
    if (obj == Py_None) {
        view->obj = NULL;
        view->buf = NULL;
        return 0;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return -1;
    if (view->itemsize != itemsize || view->len < need * itemsize) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: expected a writable buffer of %zd items of %zd bytes", what, need,
                     itemsize);
        return -1;
    }
    return 0;
}

/* score(sentences, bos, eos, totals, oovs, token_logprobs, token_oov) -> number of predicted tokens.
 * totals (float64) and oovs (int64) get one value per sentence; token_logprobs (float64) and token_oov (bool) the
 * predicted tokens of all sentences, flat (or None: not wanted). A token_* buffer must hold every token. */
static PyObject *Engine_score(Engine *self, PyObject *args) {
    PyObject *sentences, *eos_word, *o_tot, *o_oov, *o_lp, *o_tok;
    int bos;
    if (!check_ready(self) ||
        !PyArg_ParseTuple(args, "OpOOOOO", &sentences, &bos, &eos_word, &o_tot, &o_oov, &o_lp, &o_tok))
        return NULL;
    if (o_tot == Py_None) {
        PyErr_SetString(PyExc_TypeError, "totals: expected a writable float64 buffer");
        return NULL;
    }
    PyObject *sents = PySequence_Fast(sentences, "sentences must be a sequence");
    if (!sents) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(sents);
    Py_buffer b_tot, b_oov, b_lp, b_tok;
    b_oov.obj = b_lp.obj = b_tok.obj = NULL;
    if (get_out(o_tot, &b_tot, 8, ns, "totals") < 0) goto fail_sents;
    if (get_out(o_oov, &b_oov, 8, ns, "oovs") < 0) goto fail;
    if (get_out(o_lp, &b_lp, 8, 0, "token_logprobs") < 0) goto fail;
    if (get_out(o_tok, &b_tok, 1, 0, "token_oov") < 0) goto fail;
    Py_ssize_t cap_lp = b_lp.obj ? b_lp.len / 8 : 0, cap_tok = b_tok.obj ? b_tok.len : 0;
    double *tot = b_tot.buf, *lp_out = b_lp.buf;
    int64_t *oovs = b_oov.buf;
    char *tok_out = b_tok.buf;
    Py_ssize_t flat = 0;
    int64_t eos_id = 0;
    int eos_missing = 0;
    const int with_eos = eos_word != Py_None;
    if (with_eos && word_id(self, eos_word, &eos_id, &eos_missing) < 0) goto fail;
    for (Py_ssize_t s = 0; s < ns; s++) {
        /* sizes are re-read before each item: a token's own __hash__ / __eq__ (not a str's) could change a list */
        if (s >= PySequence_Fast_GET_SIZE(sents)) {
            PyErr_SetString(PyExc_RuntimeError, "the sentences changed while they were scored");
            goto fail;
        }
        PyObject *seq = PySequence_Fast(PySequence_Fast_GET_ITEM(sents, s), "each sentence must be a sequence");
        if (!seq) goto fail;
        Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
        Py_ssize_t pos = 0;
        double total = 0.0;
        int64_t noov = 0;
        Hit rows_a[MAX_ORDER], rows_b[MAX_ORDER], *prev = rows_a, *cur = rows_b, *t;
        for (int n = 0; n < self->order; n++) prev[n] = (Hit){-1, 0.0};
        if (bos) {
            step(self, self->bos >= 0 ? self->bos : self->v, 0, prev, cur);
            t = prev; prev = cur; cur = t;
            pos = 1;
        }
        for (Py_ssize_t i = 0; i < len + with_eos; i++, pos++) {
            int64_t id;
            int missing;
            if (i < len) {
                if (i >= PySequence_Fast_GET_SIZE(seq)) {
                    Py_DECREF(seq);
                    PyErr_SetString(PyExc_RuntimeError, "a sentence changed while it was scored");
                    goto fail;
                }
                PyObject *word = PySequence_Fast_GET_ITEM(seq, i);
                Py_INCREF(word);
                int rc = word_id(self, word, &id, &missing);
                Py_DECREF(word);
                if (rc < 0) {
                    Py_DECREF(seq);
                    goto fail;
                }
            } else {
                id = eos_id;
                missing = eos_missing;
            }
            double lp = step(self, id, pos, prev, cur);
            t = prev; prev = cur; cur = t;
            total += lp;
            noov += missing;
            if (lp_out || tok_out) {
                if ((lp_out && flat >= cap_lp) || (tok_out && flat >= cap_tok)) {
                    Py_DECREF(seq);
                    PyErr_SetString(PyExc_ValueError, "token buffers are too small for the sentences");
                    goto fail;
                }
                if (lp_out) lp_out[flat] = lp;
                if (tok_out) tok_out[flat] = (char)missing;
            }
            flat++;
        }
        Py_DECREF(seq);
        tot[s] = total;
        if (oovs) oovs[s] = noov;
    }
    PyBuffer_Release(&b_tot);
    if (b_oov.obj) PyBuffer_Release(&b_oov);
    if (b_lp.obj) PyBuffer_Release(&b_lp);
    if (b_tok.obj) PyBuffer_Release(&b_tok);
    Py_DECREF(sents);
    return PyLong_FromSsize_t(flat);
fail:
    if (b_tot.obj) PyBuffer_Release(&b_tot);
    if (b_oov.obj) PyBuffer_Release(&b_oov);
    if (b_lp.obj) PyBuffer_Release(&b_lp);
    if (b_tok.obj) PyBuffer_Release(&b_tok);
fail_sents:
    Py_DECREF(sents);
    return NULL;
}

/* Row of the context ids[0..len) (len >= 1) in its order's table, or -1, with its backoff weight. */
static int64_t context_row(const Engine *self, const int64_t *ids, int len, double *bow) {
    int64_t idx = ids[0];
    if (idx < 0 || idx >= self->v) return -1;
    *bow = ((const double *)self->bow[0].buf)[idx];
    for (int j = 1; j < len; j++) {
        if (ids[j] < 0 || ids[j] >= self->v) return -1;
        const Slot *s = table_find(&self->tables[j], idx * self->mult + ids[j]);
        if (!s) return -1;
        idx = s->row;
        *bow = s->bow;
    }
    return idx;
}

/* The n-gram ids[0..h) + w, given the row of its context (ignored when h is 0): its slot's prob, or 0 when not
 * listed. An n-gram is only listed when its context is (ARPA's rule, which the model enforces). */
static inline int extend(const Engine *self, int64_t ctx_row, int h, int64_t w, double *prob) {
    if (h == 0) {
        *prob = ((const double *)self->prob[0].buf)[w];
        return 1;
    }
    if (ctx_row < 0) return 0;
    const Slot *s = table_find(&self->tables[h], ctx_row * self->mult + w);
    if (!s) return 0;
    *prob = s->prob;
    return 1;
}

/* advance(state, word) -> (log10 prob, new state): NgramModel.advance for a state tuple of word ids, with the
 * numpy path's arithmetic (backoffs of the longest context first, then the probability: _logprob_ids) and its
 * state (the longest listed suffix of state + word, at most order - 1 words: _truncate). */
static PyObject *advance_tuple(Engine *self, PyObject *state, PyObject *word) {
    const int order = self->order;
    Py_ssize_t sl = PyTuple_GET_SIZE(state);
    int h = (int)(sl < order - 1 ? sl : order - 1);
    int64_t ids[MAX_ORDER + 1];
    PyObject *objs[MAX_ORDER + 1]; /* borrowed: the state's items, then the word's id */
    for (int i = 0; i < h; i++) {
        objs[i] = PyTuple_GET_ITEM(state, sl - h + i);
        ids[i] = PyLong_AsLongLong(objs[i]);
        if (ids[i] == -1 && PyErr_Occurred()) return NULL;
    }
    PyObject *val = PyDict_GetItemWithError(self->ids, word), *wobj = NULL;
    int64_t w;
    if (val) {
        w = PyLong_AsLongLong(val);
        if (w == -1 && PyErr_Occurred()) return NULL;
        objs[h] = val;
    } else {
        if (PyErr_Occurred()) return NULL;
        w = self->unk;
        if (w >= 0) {
            wobj = PyLong_FromLongLong(w);
            if (!wobj) return NULL;
            objs[h] = wobj;
        }
    }
    if (w < 0 || w >= self->v) return Py_BuildValue("(d())", -INFINITY);
    ids[h] = w;
    /* score: contexts ids[s..h) from the longest; the first listed n-gram ending in w gives the probability */
    double total = 0.0, lp = -INFINITY, prob, bow = 0.0;
    int hit = h;
    for (int s = 0; s <= h; s++) {
        int64_t row = s < h ? context_row(self, ids + s, h - s, &bow) : -1;
        if (extend(self, row, h - s, w, &prob)) {
            lp = total + prob;
            hit = s;
            break;
        }
        if (row >= 0) total += bow;
    }
    /* the state: that n-gram is the longest listed suffix ending in w; if it is a full-order one, the next one */
    int first = hit;
    if (h - first + 1 > order - 1) {
        for (first = hit + 1; first <= h; first++) {
            if (first == h) break; /* the unigram w (order >= 2) or nothing (order 1, below) */
            double unused;
            int64_t row = context_row(self, ids + first, h - first, &unused);
            if (extend(self, row, h - first, w, &prob)) break;
        }
    }
    int len = h - first + 1;
    if (len > order - 1) len = 0; /* order 1: the state is always empty */
    PyObject *out = PyTuple_New(len);
    if (!out) {
        Py_XDECREF(wobj);
        return NULL;
    }
    for (int i = 0; i < len; i++) {
        PyObject *x = objs[h + 1 - len + i];
        Py_INCREF(x);
        PyTuple_SET_ITEM(out, i, x);
    }
    Py_XDECREF(wobj);
    PyObject *lpo = PyFloat_FromDouble(lp);
    if (!lpo) {
        Py_DECREF(out);
        return NULL;
    }
    PyObject *res = PyTuple_New(2);
    if (!res) {
        Py_DECREF(lpo);
        Py_DECREF(out);
        return NULL;
    }
    PyTuple_SET_ITEM(res, 0, lpo);
    PyTuple_SET_ITEM(res, 1, out);
    return res;
}

static PyObject *Engine_advance(Engine *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!check_ready(self)) return NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "advance(state, word) takes 2 arguments");
        return NULL;
    }
    if (PyTuple_Check(args[0])) return advance_tuple(self, args[0], args[1]);
    PyObject *state = PySequence_Tuple(args[0]); /* a state given as another sequence of ids */
    if (!state) return NULL;
    PyObject *res = advance_tuple(self, state, args[1]);
    Py_DECREF(state);
    return res;
}

static PyMethodDef Engine_methods[] = {
    {"score", (PyCFunction)Engine_score, METH_VARARGS,
     "score(sentences, bos, eos_word, totals, oovs, token_logprobs, token_oov) -> number of predicted tokens"},
    {"advance", (PyCFunction)(void (*)(void))Engine_advance, METH_FASTCALL,
     "advance(state, word) -> (log10 prob, new state)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "privasr.lm.ngram._engine.Engine",
    .tp_doc = "Hash-table query engine over an NgramModel's arrays (internal).",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
};

static struct PyModuleDef engine_module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_engine",
    .m_doc = "Compiled n-gram query engine (internal to privasr.lm.ngram.model).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__engine(void) {
    if (PyType_Ready(&EngineType) < 0) return NULL;
    PyObject *m = PyModule_Create(&engine_module);
    if (!m) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
