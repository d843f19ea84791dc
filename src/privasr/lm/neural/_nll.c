/* The softmax cross-entropy of privasr.lm.neural.train's fused output layer, one row at a time.
 *
 * The trainer's output layer computes a block of logits z = h W^T (a matrix product, torch's), then needs, per row
 * r with target t, the loss log(sum_j exp(z_j + b_j)) - (z_t + b_t) and, in place of z, its gradient
 * softmax(z + b) - onehot(t), and the bias gradient (the column sums of that). As torch operations those are six
 * passes over the whole block (add the bias, max, subtract and exp, sum, divide, column sums), each streaming
 * megabytes through memory. Here each row (a few tens of KB: it stays in the L1/L2 cache) is done in three
 * passes before moving on, the exponential in AVX2/FMA registers where the CPU has them, and the rows are split
 * between OpenMP threads (the bias gradient per thread, added at the end). The module links libgomp.so.1 and is
 * imported after torch, whose CPU build loads its own libgomp.so.1: the loader then binds both to torch's copy,
 * so these rows run in torch's thread pool (a second OpenMP runtime would spin against torch's idle threads).
 *
 * The exponential is the Cephes single-precision one (range reduction by ln 2, a degree-5 polynomial): on the
 * arguments used here, z - max in [-87, 0], it is within 1.24 ulp of the true value (measured on every 7th float
 * of that range; mean 0.07 ulp). The scalar path uses the C library's expf. The results equal torch's to float
 * rounding, not bit for bit. A row with a non-finite value makes the call return None (the bias gradient
 * untouched), and the caller then computes that block with torch's operations, which propagate the NaN or inf
 * as torch does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

typedef struct {
    float *z;          /* [rows, v], the block's logits; becomes the gradient */
    const float *bias; /* [v] or NULL */
    const int64_t *targets;
    float *gbias;      /* [v] or NULL: this thread's part of the bias gradient (zeroed) */
    Py_ssize_t lo, hi, v;
    double loss;
    int finite;
    int avx2;
} job_t;

/* ---- scalar rows (any CPU) ---- */
static int row_scalar(float *z, const float *bias, Py_ssize_t v, int64_t t, float *gbias, double *loss) {
    float m = -INFINITY, chk = 0.0f;
    for (Py_ssize_t j = 0; j < v; j++) {
        float x = bias ? z[j] + bias[j] : z[j];
        z[j] = x;
        m = x > m ? x : m;
        chk += x * 0.0f; /* NaN once any value is NaN or infinite */
    }
    if (chk != chk || !isfinite(m)) return 0;
    float target = z[t] - m;
    float s = 0.0f;
    for (Py_ssize_t j = 0; j < v; j++) {
        float e = expf(z[j] - m);
        z[j] = e;
        s += e;
    }
    *loss += log((double)s) - (double)target;
    float inv = 1.0f / s;
    for (Py_ssize_t j = 0; j < v; j++) {
        z[j] *= inv;
        if (gbias) gbias[j] += z[j];
    }
    z[t] -= 1.0f;
    if (gbias) gbias[t] -= 1.0f;
    return 1;
}

#if HAVE_X86
/* Cephes expf on 8 lanes, for x <= 0 (arguments below -87.3 give about 1e-38 rather than a denormal or 0) */
__attribute__((target("avx2,fma"))) static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3365478515625f);
    x = _mm256_max_ps(x, lo);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* x - fx * ln2, with ln2 split in two for accuracy */
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    __m256 x2 = _mm256_mul_ps(x, x);
    y = _mm256_fmadd_ps(y, x2, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    /* times 2^fx, built in the exponent bits (fx >= -126 after the clamp) */
    __m256i n = _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127));
    return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(n, 23)));
}

__attribute__((target("avx2,fma"))) static inline float hmax8(__m256 a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* Four accumulators in each reduction (32 elements a step): one would wait on its own latency every 8. */
__attribute__((target("avx2,fma"))) static int row_avx2(float *z, const float *bias, Py_ssize_t v, int64_t t,
                                                       float *gbias, double *loss) {
    Py_ssize_t j, v8 = v & ~(Py_ssize_t)7, v32 = v & ~(Py_ssize_t)31;
    const __m256 zero = _mm256_setzero_ps();
    __m256 vm[4], chk[4], vs[4];
    for (int a = 0; a < 4; a++) {
        vm[a] = _mm256_set1_ps(-INFINITY);
        chk[a] = zero;
        vs[a] = zero;
    }
    for (j = 0; j < v32; j += 32)
        for (int a = 0; a < 4; a++) {
            __m256 x = _mm256_loadu_ps(z + j + 8 * a);
            if (bias) x = _mm256_add_ps(x, _mm256_loadu_ps(bias + j + 8 * a));
            _mm256_storeu_ps(z + j + 8 * a, x);
            vm[a] = _mm256_max_ps(vm[a], x);
            chk[a] = _mm256_fmadd_ps(x, zero, chk[a]);
        }
    for (; j < v8; j += 8) {
        __m256 x = _mm256_loadu_ps(z + j);
        if (bias) x = _mm256_add_ps(x, _mm256_loadu_ps(bias + j));
        _mm256_storeu_ps(z + j, x);
        vm[0] = _mm256_max_ps(vm[0], x);
        chk[0] = _mm256_fmadd_ps(x, zero, chk[0]);
    }
    float m = hmax8(_mm256_max_ps(_mm256_max_ps(vm[0], vm[1]), _mm256_max_ps(vm[2], vm[3])));
    float c = hsum8(_mm256_add_ps(_mm256_add_ps(chk[0], chk[1]), _mm256_add_ps(chk[2], chk[3])));
    for (; j < v; j++) {
        float x = bias ? z[j] + bias[j] : z[j];
        z[j] = x;
        m = x > m ? x : m;
        c += x * 0.0f;
    }
    if (c != c || !isfinite(m)) return 0;
    float target = z[t] - m;
    const __m256 vmax = _mm256_set1_ps(m);
    float tail = 0.0f;
    for (j = 0; j < v32; j += 32)
        for (int a = 0; a < 4; a++) {
            __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(z + j + 8 * a), vmax));
            _mm256_storeu_ps(z + j + 8 * a, e);
            vs[a] = _mm256_add_ps(vs[a], e);
        }
    for (; j < v8; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(z + j), vmax));
        _mm256_storeu_ps(z + j, e);
        vs[0] = _mm256_add_ps(vs[0], e);
    }
    /* the tail through the same exponential, padded (those lanes are neither stored nor summed) */
    if (j < v) {
        float buf[8];
        Py_ssize_t k, rest = v - j;
        for (k = 0; k < 8; k++) buf[k] = k < rest ? z[j + k] - m : -100.0f;
        _mm256_storeu_ps(buf, exp8(_mm256_loadu_ps(buf)));
        for (k = 0; k < rest; k++) {
            z[j + k] = buf[k];
            tail += buf[k];
        }
    }
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(vs[0], vs[1]), _mm256_add_ps(vs[2], vs[3]))) + tail;
    *loss += log((double)s) - (double)target;
    const __m256 inv = _mm256_set1_ps(1.0f / s);
    for (j = 0; j < v8; j += 8) {
        __m256 p = _mm256_mul_ps(_mm256_loadu_ps(z + j), inv);
        _mm256_storeu_ps(z + j, p);
        if (gbias) _mm256_storeu_ps(gbias + j, _mm256_add_ps(_mm256_loadu_ps(gbias + j), p));
    }
    for (; j < v; j++) {
        z[j] *= 1.0f / s;
        if (gbias) gbias[j] += z[j];
    }
    z[t] -= 1.0f;
    if (gbias) gbias[t] -= 1.0f;
    return 1;
}
#endif

static void run_job(job_t *jb) {
    jb->loss = 0.0;
    jb->finite = 1;
    for (Py_ssize_t r = jb->lo; r < jb->hi; r++) {
        float *row = jb->z + r * jb->v;
        int ok;
#if HAVE_X86
        if (jb->avx2)
            ok = row_avx2(row, jb->bias, jb->v, jb->targets[r], jb->gbias, &jb->loss);
        else
#endif
            ok = row_scalar(row, jb->bias, jb->v, jb->targets[r], jb->gbias, &jb->loss);
        if (!ok) {
            jb->finite = 0;
            break;
        }
    }
}

/* whether the CPU has AVX2 and FMA: asked once, when the module is imported */
static int avx2_fma;

static int cpu_avx2(void) {
#if HAVE_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *name, const char *fmt,
                      Py_ssize_t itemsize) {
    if (PyObject_GetBuffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s buffer", name, writable ? " writable" : "");
        return -1;
    }
    if (view->itemsize != itemsize || view->format == NULL || strchr(fmt, view->format[0]) == NULL ||
        view->format[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "%s must hold %s", name, itemsize == 4 ? "float32" : "int64");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *nll_rows(PyObject *self, PyObject *args) {
    PyObject *zo, *bo, *to, *go;
    Py_ssize_t v, threads;
    int simd = 1;
    (void)self;
    if (!PyArg_ParseTuple(args, "OnOOOn|p", &zo, &v, &bo, &to, &go, &threads, &simd)) return NULL;
    if (v <= 0) {
        PyErr_SetString(PyExc_ValueError, "the vocabulary size must be positive");
        return NULL;
    }
    if (threads < 1) threads = 1;
    Py_buffer zb, bb, tb, gb;
    int has_b = bo != Py_None, has_g = go != Py_None;
    if (get_buffer(zo, &zb, 1, "z", "f", 4) < 0) return NULL;
    if (has_b && get_buffer(bo, &bb, 0, "bias", "f", 4) < 0) goto fail_z;
    if (get_buffer(to, &tb, 0, "targets", "ql", 8) < 0) goto fail_b;
    if (has_g && get_buffer(go, &gb, 1, "gbias", "f", 4) < 0) goto fail_t;
    Py_ssize_t zn = zb.len / 4, n = tb.len / 8;
    const int64_t *targets = (const int64_t *)tb.buf;
    if (zn != n * v) {
        PyErr_Format(PyExc_ValueError, "z must hold len(targets) x v = %zd x %zd floats, not %zd", n, v, zn);
        goto fail_g;
    }
    if ((has_b && bb.len / 4 != v) || (has_g && gb.len / 4 != v)) {
        PyErr_Format(PyExc_ValueError, "bias and gbias must hold v = %zd floats", v);
        goto fail_g;
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        if (targets[r] < 0 || targets[r] >= v) {
            PyErr_Format(PyExc_IndexError, "target %lld of row %zd is outside 0 .. %zd", (long long)targets[r], r,
                         v - 1);
            goto fail_g;
        }
    }
    if (threads > n) threads = n > 0 ? n : 1;
    job_t *jobs = calloc((size_t)threads, sizeof(job_t));
    /* each thread's bias gradient apart, added to gbias only when every row was finite */
    float *extra = has_g ? calloc((size_t)threads * (size_t)v, sizeof(float)) : NULL;
    if (!jobs || (has_g && !extra)) {
        free(jobs);
        free(extra);
        PyErr_NoMemory();
        goto fail_g;
    }
    int avx2 = simd && avx2_fma;
    for (Py_ssize_t k = 0; k < threads; k++) {
        job_t *jb = &jobs[k];
        jb->z = (float *)zb.buf;
        jb->bias = has_b ? (const float *)bb.buf : NULL;
        jb->targets = targets;
        jb->gbias = has_g ? extra + (size_t)k * (size_t)v : NULL;
        jb->lo = n * k / threads;
        jb->hi = n * (k + 1) / threads;
        jb->v = v;
        jb->avx2 = avx2;
    }
    Py_BEGIN_ALLOW_THREADS
#ifdef _OPENMP
#pragma omp parallel for num_threads((int)threads) schedule(static, 1)
#endif
    for (Py_ssize_t k = 0; k < threads; k++) run_job(&jobs[k]);
    Py_END_ALLOW_THREADS
    double loss = 0.0;
    int finite = 1;
    for (Py_ssize_t k = 0; k < threads; k++) {
        loss += jobs[k].loss;
        finite &= jobs[k].finite;
    }
    if (has_g && finite)
        for (Py_ssize_t k = 0; k < threads; k++) {
            float *g = (float *)gb.buf, *e = extra + (size_t)k * (size_t)v;
            for (Py_ssize_t j = 0; j < v; j++) g[j] += e[j];
        }
    free(jobs);
    free(extra);
    if (has_g) PyBuffer_Release(&gb);
    PyBuffer_Release(&tb);
    if (has_b) PyBuffer_Release(&bb);
    PyBuffer_Release(&zb);
    if (!finite) Py_RETURN_NONE;
    return PyFloat_FromDouble(loss);
fail_g:
    if (has_g) PyBuffer_Release(&gb);
fail_t:
    PyBuffer_Release(&tb);
fail_b:
    if (has_b) PyBuffer_Release(&bb);
fail_z:
    PyBuffer_Release(&zb);
    return NULL;
}

static PyObject *has_avx2(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(avx2_fma);
}

static PyMethodDef methods[] = {
    {"nll_rows", nll_rows, METH_VARARGS,
     "nll_rows(z, v, bias, targets, gbias, threads[, simd]) -> float | None\n\n"
     "The summed softmax cross-entropy of the rows of z (float32 [len(targets), v], C order) plus bias (float32 "
     "[v] or None) against targets (int64); z becomes the gradient softmax - onehot, and gbias (float32 [v] or "
     "None) gets its column sums added. None when a row holds a NaN or an infinity (z is then partly "
     "overwritten, gbias unchanged). A false simd takes the scalar rows even where AVX2/FMA is "
     "available."},
    {"has_avx2", has_avx2, METH_NOARGS, "Whether the rows run in AVX2/FMA registers on this CPU."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nll",
                                    "The fused softmax cross-entropy rows of the neural trainer's output layer.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__nll(void) {
    avx2_fma = cpu_avx2();
    return PyModule_Create(&module);
}
