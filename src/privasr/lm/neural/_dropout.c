/* The dropout masks of privasr.lm.neural.dropout, drawn from torch's CPU generator as torch draws them.
 *
 * torch's CPU dropout fills its noise tensor with bernoulli_(1 - p), one element at a time in memory order: per
 * element two 32-bit outputs of the generator's MT19937 (hi, then lo) make a 64-bit word, its low 53 bits times
 * 2^-53 a uniform double u, and the element is u < 1 - p; then the noise is divided by 1 - p. That loop costs
 * 8-14 ns an element (a serial generator call per draw). Here the same MT19937 runs over the generator's own
 * state, a block of 624 words at a time, in loops the compiler vectorises, and the comparison is done on the
 * integers (k * 2^-53 < q, with k an integer below 2^53, is k < ceil(q * 2^53)): the same masks for the same
 * state, bit for bit, at about 1-2 ns an element. The caller (dropout.py) passes torch.get_rng_state()'s bytes
 * and sets the returned state back, so the generator ends where torch's own draws would have left it; dropout.py
 * checks once against torch's bernoulli_ before trusting this module, and uses torch's dropout otherwise.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#define MT_N 624
#define MT_M 397
#define MATRIX_A 0x9908b0dfU
#define UPPER 0x80000000U
#define LOWER 0x7fffffffU

/* The legacy layout of torch.get_rng_state() (THGeneratorState, then the float-normal cache): the seed
 * (uint64), left (int32), seeded (int32), next (uint64), the 624 state words (each in a uint64), normal fields. */
#define OFF_LEFT 8
#define OFF_NEXT 16
#define OFF_STATE 24
#define STATE_BYTES 5056

static inline void refill(uint32_t *mt) {
    int i;
    for (i = 0; i < MT_N - MT_M; i++) {
        uint32_t y = (mt[i] & UPPER) | (mt[i + 1] & LOWER);
        mt[i] = mt[i + MT_M] ^ (y >> 1) ^ ((0U - (y & 1U)) & MATRIX_A);
    }
    for (; i < MT_N - 1; i++) {
        uint32_t y = (mt[i] & UPPER) | (mt[i + 1] & LOWER);
        mt[i] = mt[i + MT_M - MT_N] ^ (y >> 1) ^ ((0U - (y & 1U)) & MATRIX_A);
    }
    uint32_t y = (mt[MT_N - 1] & UPPER) | (mt[0] & LOWER);
    mt[MT_N - 1] = mt[MT_M - 1] ^ (y >> 1) ^ ((0U - (y & 1U)) & MATRIX_A);
}

static inline uint32_t temper(uint32_t y) {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= y >> 18;
    return y;
}

/* n tempered outputs into out, from mt at *pos (refilling when a block is used up) */
static inline void draw(uint32_t *mt, int *pos, uint32_t *out, Py_ssize_t n) {
    while (n > 0) {
        if (*pos >= MT_N) {
            refill(mt);
            *pos = 0;
        }
        Py_ssize_t k = MT_N - *pos;
        if (k > n) k = n;
        const uint32_t *src = mt + *pos;
        for (Py_ssize_t i = 0; i < k; i++) out[i] = temper(src[i]);
        out += k;
        n -= k;
        *pos += (int)k;
    }
}

#define CHUNK 4096 /* elements per pass: 2 * CHUNK words of scratch on the stack */

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx2", "default"))) /* AVX2 where the CPU has it, picked at load */
#else
#define CLONES
#endif

/* dst[i] = value with probability keep (word < threshold), else 0, for n elements; two words per element */
CLONES static void fill(uint32_t *mt, int *pos, float *dst, Py_ssize_t n, uint64_t threshold, float value) {
    uint32_t words[2 * CHUNK];
    const uint32_t th_hi = (uint32_t)(threshold >> 32), th_lo = (uint32_t)threshold;
    while (n > 0) {
        Py_ssize_t k = n < CHUNK ? n : CHUNK;
        draw(mt, pos, words, 2 * k);
        for (Py_ssize_t i = 0; i < k; i++) {
            /* (hi & (2^21 - 1)) * 2^32 + lo < threshold, in 32-bit pieces (vectorises without 64-bit compares) */
            uint32_t hi = words[2 * i] & 0x1FFFFFU, lo = words[2 * i + 1];
            int below = (hi < th_hi) | ((hi == th_hi) & (lo < th_lo));
            dst[i] = below ? value : 0.0f;
        }
        dst += k;
        n -= k;
    }
}

/* bernoulli_scaled(out, state, keep, value) -> bytes */
static PyObject *bernoulli_scaled(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "bernoulli_scaled(out, state, keep, value) takes 4 arguments");
        return NULL;
    }
    double keep = PyFloat_AsDouble(args[2]);
    if (keep == -1.0 && PyErr_Occurred()) return NULL;
    double value_d = PyFloat_AsDouble(args[3]);
    if (value_d == -1.0 && PyErr_Occurred()) return NULL;
    if (!(keep > 0.0 && keep < 1.0)) {
        PyErr_SetString(PyExc_ValueError, "keep must be in (0, 1)");
        return NULL;
    }
    Py_buffer out, st;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (out.itemsize != 4 || out.format == NULL || strcmp(out.format, "f") != 0) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_TypeError, "out must be a writable C-contiguous float32 buffer");
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &st, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    if (st.len != STATE_BYTES) {
        PyBuffer_Release(&out);
        PyBuffer_Release(&st);
        PyErr_Format(PyExc_ValueError, "state must be %d bytes (torch.get_rng_state()), got %zd", STATE_BYTES,
                     st.len);
        return NULL;
    }
    PyObject *result = PyBytes_FromStringAndSize((const char *)st.buf, STATE_BYTES);
    PyBuffer_Release(&st);
    if (result == NULL) {
        PyBuffer_Release(&out);
        return NULL;
    }
    char *raw = PyBytes_AS_STRING(result);
    int32_t left;
    memcpy(&left, raw + OFF_LEFT, 4);
    if (left < 1 || left > MT_N + 1) {
        PyBuffer_Release(&out);
        Py_DECREF(result);
        PyErr_SetString(PyExc_ValueError, "state is not an MT19937 generator state");
        return NULL;
    }
    uint32_t mt[MT_N];
    for (int i = 0; i < MT_N; i++) {
        uint64_t w;
        memcpy(&w, raw + OFF_STATE + 8 * i, 8);
        mt[i] = (uint32_t)w;
    }
    /* torch draws with `if (--left == 0) refill; return state[next++]`: left + next == 625 after a refill,
     * and left == 1 before the first one, so the next word to use is 625 - left (624: refill first) */
    int pos = MT_N + 1 - left;
    const uint64_t threshold = (uint64_t)ceil(keep * 9007199254740992.0); /* ceil(keep * 2^53) */
    const float value = (float)value_d;
    float *dst = (float *)out.buf;
    Py_ssize_t n = out.len / 4;
    if (n == 0) { /* no draws: the state as it was */
        PyBuffer_Release(&out);
        return result;
    }
    Py_BEGIN_ALLOW_THREADS
    fill(mt, &pos, dst, n, threshold, value);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    for (int i = 0; i < MT_N; i++) {
        uint64_t w = mt[i];
        memcpy(raw + OFF_STATE + 8 * i, &w, 8);
    }
    left = MT_N + 1 - pos;
    uint64_t next = (uint64_t)pos;
    memcpy(raw + OFF_LEFT, &left, 4);
    memcpy(raw + OFF_NEXT, &next, 8);
    return result;
}

static PyMethodDef methods[] = {
    {"bernoulli_scaled", (PyCFunction)(void (*)(void))bernoulli_scaled, METH_FASTCALL,
     "bernoulli_scaled(out, state, keep, value) -> bytes\n\n"
     "Fill the float32 buffer out with value (probability keep) or 0, drawn as torch's CPU bernoulli_(keep) "
     "draws them from the generator state `state` (torch.get_rng_state()'s 5056 bytes); return the state after "
     "the draws."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_dropout",
                                    "torch-identical CPU dropout masks (see dropout.py)", -1, methods};

PyMODINIT_FUNC PyInit__dropout(void) { return PyModule_Create(&module); }
