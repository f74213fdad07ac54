/* The element-wise work between two matrix products of an S-Mixer, forward and backward, one thread.
 *
 * Forward, for a row-major (rows, n) float32 stream x, the product z of the sublayer's Dense (without its bias b) and
 * the next sublayer's LayerNorm (weight w, bias beta):
 *     y = x + gelu(z + b)        the residual sum of the sublayer (exact GELU, x Phi(x))
 *     u = LayerNorm(y) w + beta  the input of the next sublayer's Dense
 * Backward, from the gradients of y (gy, the next residual; may be absent) and u (gu):
 *     gy' = gy + the LayerNorm's input gradient of gu,   gx = gy',   gz = gy' gelu'(z + b),
 * and the gradients of w, beta and b. b runs along the channels (period 0: b[j] for channel j) or along the rows, one
 * per token (the token mixing's bias; period S): b[(r / repeat) mod S] for row r, repeat 1 on a (B, S, C) stream
 * (row b S + s) and B on a sequence-first (S, B, C) one (row s B + b).
 *
 * Each element is read and written once in each direction, so the stream passes through memory four times in the
 * forward (x, z in; y, u out) and six in the backward, where torch's GELU, sum and LayerNorm, their backwards, the
 * gradient accumulation and the bias reduction each pass over it on their own. Work runs in vectors of VEC floats.
 * Rows of 16 channels or more go GROUP at a time, each as vectors along its channels (the last vector ending at the
 * row's end, see row_t), so that the sums of the rows' LayerNorms run side by side. Rows of n = 4 or 8 channels are
 * packed VEC / n to a vector, as they lie in memory, GROUP vectors at a time, each step for all of them before the
 * next, and each row's sums are taken within its segment of the vector (a butterfly of lane shuffles). Other widths
 * below 16 are refused (the caller runs torch's operators).
 *
 * erf is the rational approximation of Eigen and XLA (clamped to [-4, 4]), exp a Cody-Waite reduction with Cephes's
 * polynomial, both in plain arithmetic and explicit fused multiply-adds (fmaf, one rounding whether the instruction
 * or the library computes it), so that with -ffp-contract=off (the loader's flags) and IEEE division and square
 * root the element-wise results do not depend on the x86-64 level; the sums over a row's channels (the LayerNorm's
 * moments and its backward's) and the parameter gradients add in the order of VEC lanes, so builds with the same
 * VEC (the baseline and x86-64-v3) give the same bits and an AVX-512 build may differ from them in the last bits.
 * The parameter gradients accumulate per block of rows in float and the blocks in double.
 */
#include <math.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#include <stddef.h>
#include <string.h>

/* A vector is one machine register: 16 floats with AVX-512, 8 otherwise. GCC splits a 16-float vector into two
 * halves on an AVX2 machine, but its code for them ran 3-4 times as long as the same work in 8-float vectors. */
#ifndef VEC /* a build may choose it (the tests build AVX-512's width for an AVX2 machine) */
#ifdef __AVX512F__
#define VEC 16
#else
#define VEC 8
#endif
#endif
#define MAX_VECS (2048 / VEC) /* rows up to 2048 channels, biases up to 2048 tokens */
#define BLOCK 64              /* rows (vectors, packed) whose parameter gradients are summed in float */
#define GROUP 4               /* rows computed side by side */
/* Vectors of a row (16 channels or more) whose GELU, and whose GELU gradient, run in lockstep: on the AVX2 machine of
 * docs/performance.md four made the forward about a tenth faster, and more than one made the backward, whose
 * lockstep state spills out of the registers, no faster. */
#ifndef FORWARD_LANES
#define FORWARD_LANES 4
#endif
#ifndef BACKWARD_LANES
#define BACKWARD_LANES 1
#endif
#ifndef AHEAD
#define AHEAD 4 /* rows (of 16 floats, packed) whose cache lines are asked for ahead of their use */
#endif
typedef float vec_t __attribute__((vector_size(VEC * sizeof(float))));
typedef int ivec_t __attribute__((vector_size(VEC * sizeof(int))));

static inline __attribute__((always_inline)) vec_t splat(float a) {
    vec_t v = {0.0f};
    return v + a;
}

static inline __attribute__((always_inline)) vec_t select(ivec_t mask, vec_t a, vec_t b) {
    return (vec_t)((mask & (ivec_t)a) | (~mask & (ivec_t)b));
}

/* x < lo ? lo : x, and x > hi ? hi : x (a NaN stays NaN, -0 stays -0): one instruction each where the vector is one
 * AVX or AVX-512 register, whose max and min are these selects. */
static inline __attribute__((always_inline)) vec_t at_least(vec_t x, float lo) {
#if VEC == 16 && defined(__AVX512F__)
    return (vec_t)_mm512_max_ps((__m512)splat(lo), (__m512)x);
#elif VEC == 8 && defined(__AVX__)
    return (vec_t)_mm256_max_ps((__m256)splat(lo), (__m256)x);
#else
    return select(x < splat(lo), splat(lo), x);
#endif
}

static inline __attribute__((always_inline)) vec_t at_most(vec_t x, float hi) {
#if VEC == 16 && defined(__AVX512F__)
    return (vec_t)_mm512_min_ps((__m512)splat(hi), (__m512)x);
#elif VEC == 8 && defined(__AVX__)
    return (vec_t)_mm256_min_ps((__m256)splat(hi), (__m256)x);
#else
    return select(x > splat(hi), splat(hi), x);
#endif
}

static inline __attribute__((always_inline)) vec_t clamp(vec_t x, float lo, float hi) {
    return at_most(at_least(x, lo), hi);
}

/* a b + c, rounded once (IEEE fused multiply-add: the same bits whether the machine has the instruction or the
 * library computes it). The instruction is named where the vector is one register with it, as the compiler does not
 * always turn the loop over lanes into it in long inlined code. */
static inline __attribute__((always_inline)) vec_t fma_(vec_t a, vec_t b, float c) {
#if VEC == 16 && defined(__AVX512F__)
    return (vec_t)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)splat(c));
#elif VEC == 8 && defined(__FMA__)
    return (vec_t)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)splat(c));
#else
    vec_t r;
    for (int k = 0; k < VEC; ++k) r[k] = fmaf(a[k], b[k], c);
    return r;
#endif
}

/* The element-wise functions below work on `count` vectors in lockstep, each step for all of them before the next,
 * so that their dependency chains overlap in the machine's schedulers (count, at most LOCKSTEP, is a constant where
 * they are inlined). */
#define LOCKSTEP 4
#if GROUP > LOCKSTEP || FORWARD_LANES > LOCKSTEP || BACKWARD_LANES > LOCKSTEP
#error "the element-wise functions take at most LOCKSTEP vectors at once"
#endif

/* erf(x): x P(x^2) / Q(x^2) on [-4, 4] (Eigen's generic_fast_erf_float, Horner's rule in fused multiply-adds), +-1
 * beyond. */
static inline __attribute__((always_inline)) void verf(vec_t* x, const int count) {
    vec_t x2[LOCKSTEP], p[LOCKSTEP], q[LOCKSTEP];
    for (int j = 0; j < count; ++j) x[j] = clamp(x[j], -4.0f, 4.0f), x2[j] = x[j] * x[j];
    for (int j = 0; j < count; ++j) p[j] = fma_(x2[j], splat(-2.72614225801306e-10f), 2.77068142495902e-08f);
    for (int j = 0; j < count; ++j) q[j] = fma_(x2[j], splat(-1.45660718464996e-05f), -2.13374055278905e-04f);
    for (int j = 0; j < count; ++j) p[j] = fma_(x2[j], p[j], -2.10102402082508e-06f);
    for (int j = 0; j < count; ++j) q[j] = fma_(x2[j], q[j], -1.68282697438203e-03f);
    for (int j = 0; j < count; ++j) p[j] = fma_(x2[j], p[j], -5.69250639462346e-05f);
    for (int j = 0; j < count; ++j) q[j] = fma_(x2[j], q[j], -7.37332916720468e-03f);
    for (int j = 0; j < count; ++j) p[j] = fma_(x2[j], p[j], -7.34990630326855e-04f);
    for (int j = 0; j < count; ++j) q[j] = fma_(x2[j], q[j], -1.42647390514189e-02f);
    for (int j = 0; j < count; ++j) p[j] = fma_(x2[j], p[j], -2.95459980854025e-03f);
    for (int j = 0; j < count; ++j) p[j] = fma_(x2[j], p[j], -1.60960333262415e-02f);
    for (int j = 0; j < count; ++j) x[j] = x[j] * p[j] / q[j];
}

/* exp(x) for x <= 0, which the caller ensures (x below -87 is taken as -87, whose exp is below 2^-125): x = k ln 2 + r,
 * |r| <= ln 2 / 2, exp(r) by Cephes's expf polynomial. */
static inline __attribute__((always_inline)) void vexp_nonpositive(vec_t* x, const int count) {
    const vec_t magic = splat(12582912.0f); /* 1.5 * 2^23: adding and subtracting it rounds to an integer */
    vec_t n[LOCKSTEP], r[LOCKSTEP], p[LOCKSTEP];
    for (int j = 0; j < count; ++j) x[j] = at_least(x[j], -87.0f);
    for (int j = 0; j < count; ++j) n[j] = (x[j] * 1.44269504088896341f + magic) - magic;
    for (int j = 0; j < count; ++j) r[j] = (x[j] - n[j] * 0.693359375f) - n[j] * -2.12194440e-4f;
    for (int j = 0; j < count; ++j) p[j] = fma_(r[j], splat(1.9875691500e-4f), 1.3981999507e-3f);
    for (int j = 0; j < count; ++j) p[j] = fma_(p[j], r[j], 8.3334519073e-3f);
    for (int j = 0; j < count; ++j) p[j] = fma_(p[j], r[j], 4.1665795894e-2f);
    for (int j = 0; j < count; ++j) p[j] = fma_(p[j], r[j], 1.6666665459e-1f);
    for (int j = 0; j < count; ++j) p[j] = fma_(p[j], r[j], 5.0000001201e-1f);
    for (int j = 0; j < count; ++j) {
        const vec_t e = (p[j] * (r[j] * r[j]) + r[j]) + 1.0f;
        const ivec_t bits = (__builtin_convertvector(n[j], ivec_t) + 127) << 23;
        x[j] = e * (vec_t)bits;
    }
}

#define SQRT_HALF 0.70710678118654752f
#define INV_SQRT_2PI 0.39894228040143268f

/* v <- gelu(v) = v Phi(v), Phi(v) = (erf(v / sqrt 2) + 1) / 2 as one fused multiply-add e / 2 + 1 / 2 (the same bits
 * as halving the rounded sum: scaling by 2^-1 commutes with rounding where nothing underflows). */
static inline __attribute__((always_inline)) void gelu(vec_t* v, const int count) {
    vec_t e[LOCKSTEP];
    for (int j = 0; j < count; ++j) e[j] = v[j] * SQRT_HALF;
    verf(e, count);
    for (int j = 0; j < count; ++j) v[j] = v[j] * fma_(e[j], splat(0.5f), 0.5f);
}

/* v <- gelu'(v) = Phi(v) + v phi(v) (Phi as in gelu; phi's exponent -v^2 / 2 is never positive). */
static inline __attribute__((always_inline)) void gelu_grad(vec_t* v, const int count) {
    vec_t e[LOCKSTEP], q[LOCKSTEP];
    for (int j = 0; j < count; ++j) e[j] = v[j] * SQRT_HALF, q[j] = -0.5f * (v[j] * v[j]);
    verf(e, count);
    vexp_nonpositive(q, count);
    for (int j = 0; j < count; ++j) v[j] = fma_(e[j], splat(0.5f), 0.5f) + v[j] * (INV_SQRT_2PI * q[j]);
}

/* The sum of a vector's lanes, pairwise (halving the vector until one lane is left). */
static inline __attribute__((always_inline)) float total(vec_t v) {
    float s[VEC];
    memcpy(s, &v, sizeof v);
    for (int width = VEC / 2; width >= 1; width /= 2)
        for (int k = 0; k < width; ++k) s[k] = s[k] + s[k + width];
    return s[0];
}

static inline __attribute__((always_inline)) vec_t vsqrt(vec_t v) {
    for (int k = 0; k < VEC; ++k) v[k] = sqrtf(v[k]);
    return v;
}

/* i mod m for 0 <= i, by subtraction (i is at most a few m). */
static inline __attribute__((always_inline)) ptrdiff_t wrap(ptrdiff_t i, ptrdiff_t m) {
    while (i >= m) i -= m;
    return i;
}

/* The token of the row a walk over the stream is at: `period` tokens (0 for a channel bias), each over `repeat`
 * consecutive rows (module comment). */
typedef struct {
    ptrdiff_t token, within, period, repeat;
} tokens_t;

static inline __attribute__((always_inline)) tokens_t tokens_from_start(ptrdiff_t period, ptrdiff_t repeat) {
    const tokens_t t = {0, 0, period, repeat};
    return t;
}

static inline __attribute__((always_inline)) void next_row(tokens_t* t) {
    if (t->period && ++t->within == t->repeat) {
        t->within = 0;
        t->token = wrap(t->token + 1, t->period);
    }
}

/* ---- rows of 16 channels or more, each as vectors along its channels ---------------------------------------- */

/* A row of n >= VEC channels as nv vectors: vector k holds channels at[k] .. at[k] + VEC - 1, at[k] = k VEC but for
 * the last one, which ends at the row's end and so overlaps the one before where VEC does not divide n; new[k] is 1
 * in the lanes of channels no earlier vector holds, 0 in the others (the row's sums count every channel once;
 * values computed twice are the same and stored twice). */
typedef struct {
    ptrdiff_t nv, at[MAX_VECS];
    vec_t new[MAX_VECS];
} row_t;

/* The offset of vector k and the vector with its new channels (v times new[k]): k VEC and v itself where the row is
 * whole vectors (`whole`, n a multiple of VEC, a constant where inlined: multiplying by 1 changes no bit). */
static inline __attribute__((always_inline)) ptrdiff_t at(const row_t* row, ptrdiff_t k, const int whole) {
    return whole ? k * VEC : row->at[k];
}

static inline __attribute__((always_inline)) vec_t fresh(vec_t v, const row_t* row, ptrdiff_t k, const int whole) {
    return whole ? v : v * row->new[k];
}

static void row_layout(row_t* row, ptrdiff_t n) {
    row->nv = (n + VEC - 1) / VEC;
    for (ptrdiff_t k = 0; k < row->nv; ++k) {
        row->at[k] = k * VEC + VEC <= n ? k * VEC : n - VEC;
        for (int l = 0; l < VEC; ++l) row->new[k][l] = row->at[k] + l >= k * VEC ? 1.0f : 0.0f;
    }
}

static inline __attribute__((always_inline)) vec_t loadv(const float* p) {
    vec_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void storev(float* p, vec_t v) { memcpy(p, &v, sizeof v); }

/* Ask for the cache lines of floats [from, from + count) of p, those below limit, ahead of their use, in AVX-512
 * builds; others leave these streams to the hardware's prefetcher (on the AVX2 machine of docs/performance.md the
 * kernel ran faster without the requests, which cost instructions). */
static inline __attribute__((always_inline)) void ahead(const float* p, ptrdiff_t from, ptrdiff_t count,
                                                        ptrdiff_t limit) {
#ifndef __AVX512F__
    (void)p, (void)from, (void)count, (void)limit;
    return;
#endif
    if (!p) return;
    const ptrdiff_t end = from + count < limit ? from + count : limit;
    for (ptrdiff_t i = from; i < end; i += 64 / sizeof(float)) __builtin_prefetch(p + i);
}

/* Add a vector-per-k sum (channels at[k] + l) into per-channel totals, each channel once. */
static void add_by_channel(double* total_, const vec_t* sums, const row_t* row) {
    for (ptrdiff_t k = 0; k < row->nv; ++k)
        for (int l = 0; l < VEC; ++l)
            if (row->new[k][l] != 0.0f) total_[row->at[k] + l] += sums[k][l];
}

/* Vectors k .. k + count - 1 of a row (x, z and y at the row's start) in lockstep: y = x + gelu(z + cb + tb), into
 * the row's registers yv and memory; returns the row's running sum s plus their new channels. */
static inline __attribute__((always_inline)) vec_t residual_gelu(const float* x, const float* z, const vec_t* cb,
                                                                 vec_t tb, const row_t* row, ptrdiff_t k,
                                                                 const int count, const int whole, vec_t* yv, float* y,
                                                                 vec_t s) {
    vec_t v[LOCKSTEP];
    for (int j = 0; j < count; ++j) v[j] = loadv(z + at(row, k + j, whole)) + (cb[k + j] + tb);
    gelu(v, count);
    for (int j = 0; j < count; ++j) {
        yv[k + j] = loadv(x + at(row, k + j, whole)) + v[j];
        s += fresh(yv[k + j], row, k + j, whole);
        storev(y + at(row, k + j, whole), yv[k + j]);
    }
    return s;
}

/* forward_rows for a row layout and whether it is whole vectors (a constant where inlined). */
static inline __attribute__((always_inline)) void forward_rows_of(const float* x, const float* z, const float* bias,
                                                                  ptrdiff_t period, ptrdiff_t repeat,
                                                                  const float* weight, const float* beta, float* y,
                                                                  float* u, float* mean, float* rstd, ptrdiff_t rows,
                                                                  ptrdiff_t n, float eps, const row_t* row,
                                                                  const int whole) {
    const ptrdiff_t nv = row->nv;
    vec_t w[MAX_VECS], be[MAX_VECS], cb[MAX_VECS], yv[GROUP][MAX_VECS];
    for (ptrdiff_t k = 0; k < nv; ++k) {
        w[k] = loadv(weight + row->at[k]);
        be[k] = loadv(beta + row->at[k]);
        cb[k] = period ? splat(0.0f) : loadv(bias + row->at[k]);
    }
    tokens_t tok = tokens_from_start(period, repeat);
    for (ptrdiff_t r0 = 0; r0 < rows; r0 += GROUP) {
        const int g = rows - r0 < GROUP ? (int)(rows - r0) : GROUP;
        vec_t sums[GROUP];
        float m[GROUP], rs[GROUP];
        for (int i = 0; i < g; ++i, next_row(&tok)) {
            const ptrdiff_t r = r0 + i;
            ahead(x, (r + AHEAD) * n, n, rows * n);
            ahead(z, (r + AHEAD) * n, n, rows * n);
            const vec_t tb = splat(period ? bias[tok.token] : 0.0f);
            vec_t s = splat(0.0f);
            for (ptrdiff_t k = 0; k < nv; k += FORWARD_LANES)
                if (k + FORWARD_LANES <= nv)
                    s = residual_gelu(x + r * n, z + r * n, cb, tb, row, k, FORWARD_LANES, whole, yv[i], y + r * n,
                                      s);
                else
                    for (ptrdiff_t l = k; l < nv; ++l)
                        s = residual_gelu(x + r * n, z + r * n, cb, tb, row, l, 1, whole, yv[i], y + r * n, s);
            sums[i] = s;
        }
        for (int i = 0; i < g; ++i) m[i] = total(sums[i]) / (float)n;
        for (int i = 0; i < g; ++i) {
            vec_t v = splat(0.0f);
            for (ptrdiff_t k = 0; k < nv; ++k) {
                const vec_t d = fresh(yv[i][k] - m[i], row, k, whole);
                v += d * d;
            }
            sums[i] = v;
        }
        for (int i = 0; i < g; ++i) rs[i] = 1.0f / sqrtf(total(sums[i]) / (float)n + eps);
        for (int i = 0; i < g; ++i) {
            const ptrdiff_t r = r0 + i;
            for (ptrdiff_t k = 0; k < nv; ++k)
                storev(u + r * n + at(row, k, whole), (yv[i][k] - m[i]) * rs[i] * w[k] + be[k]);
            if (mean) mean[r] = m[i];
            if (rstd) rstd[r] = rs[i];
        }
    }
}

static int forward_rows(const float* x, const float* z, const float* bias, ptrdiff_t period, ptrdiff_t repeat,
                        const float* weight, const float* beta, float* y, float* u, float* mean, float* rstd,
                        ptrdiff_t rows, ptrdiff_t n, float eps) {
    if (n < VEC || n > MAX_VECS * VEC) return 1;
    row_t row;
    row_layout(&row, n);
    if (n % VEC == 0)
        forward_rows_of(x, z, bias, period, repeat, weight, beta, y, u, mean, rstd, rows, n, eps, &row, 1);
    else
        forward_rows_of(x, z, bias, period, repeat, weight, beta, y, u, mean, rstd, rows, n, eps, &row, 0);
    return 0;
}

/* Vectors k .. k + count - 1 of a row in lockstep (gy, z, gx and gz at the row's start; gy may be NULL): the
 * LayerNorm's input gradient from the x-hat gradient g, x-hat h and the row's means c1, c2 of g and g h, plus gy,
 * into gx; times gelu'(z + cb + tb) into gz and, for a channel bias, its sums bb; returns, for a token bias (`token`),
 * the row's running sum sr plus their new channels (sr itself for a channel bias). */
static inline __attribute__((always_inline)) vec_t residual_gelu_grad(const float* gy, const float* z,
                                                                      const vec_t* cb, vec_t tb, const vec_t* g,
                                                                      const vec_t* h, float c1, float c2, float rs,
                                                                      const row_t* row, ptrdiff_t k, const int count,
                                                                      const int whole, const int token, float* gx,
                                                                      float* gz, vec_t* bb, vec_t sr) {
    vec_t gk[LOCKSTEP], v[LOCKSTEP];
    for (int j = 0; j < count; ++j) {
        gk[j] = ((g[k + j] - c1) - h[k + j] * c2) * rs;
        if (gy) gk[j] = loadv(gy + at(row, k + j, whole)) + gk[j];
        storev(gx + at(row, k + j, whole), gk[j]);
        v[j] = loadv(z + at(row, k + j, whole)) + (cb[k + j] + tb);
    }
    gelu_grad(v, count);
    for (int j = 0; j < count; ++j) {
        const vec_t t = gk[j] * v[j];
        storev(gz + at(row, k + j, whole), t);
        if (token)
            sr += fresh(t, row, k + j, whole);
        else
            bb[k + j] += t;
    }
    return sr;
}

/* backward_rows for a row layout, whether it is whole vectors and the bias kind (constants where inlined). */
static inline __attribute__((always_inline)) void backward_rows_of(
    const float* gy, const float* gu, const float* y, const float* mean, const float* rstd, const float* weight,
    const float* z, const float* bias, ptrdiff_t period, ptrdiff_t repeat, float* gx, float* gz, float* gweight,
    float* gbeta, float* gbias, ptrdiff_t rows, ptrdiff_t n, const row_t* row, const int whole, const int token) {
    const ptrdiff_t nv = row->nv;
    vec_t w[MAX_VECS], cb[MAX_VECS], g[MAX_VECS], h[MAX_VECS];
    vec_t bw[MAX_VECS], bbe[MAX_VECS], bb[MAX_VECS]; /* this block's sums */
    double accw[MAX_VECS * VEC] = {0}, accbe[MAX_VECS * VEC] = {0}, accb[MAX_VECS * VEC] = {0};
    for (ptrdiff_t k = 0; k < nv; ++k) {
        w[k] = loadv(weight + row->at[k]);
        cb[k] = token ? splat(0.0f) : loadv(bias + row->at[k]);
    }
    tokens_t tok = tokens_from_start(period, repeat);
    for (ptrdiff_t start = 0; start < rows; start += BLOCK) {
        const ptrdiff_t end = start + BLOCK < rows ? start + BLOCK : rows;
        for (ptrdiff_t k = 0; k < nv; ++k) bw[k] = bbe[k] = bb[k] = splat(0.0f);
        for (ptrdiff_t r = start; r < end; ++r, next_row(&tok)) {
            ahead(gu, (r + AHEAD) * n, n, rows * n);
            ahead(y, (r + AHEAD) * n, n, rows * n);
            ahead(z, (r + AHEAD) * n, n, rows * n);
            ahead(gy, (r + AHEAD) * n, n, rows * n);
            const float m = mean[r], rs = rstd[r];
            vec_t s1 = splat(0.0f), s2 = splat(0.0f);
            for (ptrdiff_t k = 0; k < nv; ++k) {
                const vec_t gk = loadv(gu + r * n + at(row, k, whole));
                h[k] = (loadv(y + r * n + at(row, k, whole)) - m) * rs; /* x-hat */
                bw[k] += gk * h[k];
                bbe[k] += gk;
                g[k] = gk * w[k]; /* gradient of x-hat */
                s1 += fresh(g[k], row, k, whole);
                s2 += fresh(g[k] * h[k], row, k, whole);
            }
            const float c1 = total(s1) / (float)n, c2 = total(s2) / (float)n;
            const vec_t tb = splat(token ? bias[tok.token] : 0.0f);
            vec_t sr = splat(0.0f);
            for (ptrdiff_t k = 0; k < nv; k += BACKWARD_LANES) {
                const ptrdiff_t o = r * n;
                if (k + BACKWARD_LANES <= nv)
                    sr = residual_gelu_grad(gy ? gy + o : NULL, z + o, cb, tb, g, h, c1, c2, rs, row, k,
                                            BACKWARD_LANES, whole, token, gx + o, gz + o, bb, sr);
                else
                    for (ptrdiff_t l = k; l < nv; ++l)
                        sr = residual_gelu_grad(gy ? gy + o : NULL, z + o, cb, tb, g, h, c1, c2, rs, row, l, 1, whole,
                                                token, gx + o, gz + o, bb, sr);
            }
            if (token) accb[tok.token] += total(sr);
        }
        add_by_channel(accw, bw, row);
        add_by_channel(accbe, bbe, row);
        if (!token) add_by_channel(accb, bb, row);
    }
    for (ptrdiff_t j = 0; j < n; ++j) {
        gweight[j] = (float)accw[j];
        gbeta[j] = (float)accbe[j];
    }
    for (ptrdiff_t j = 0; j < (token ? period : n); ++j) gbias[j] = (float)accb[j];
}

static int backward_rows(const float* gy, const float* gu, const float* y, const float* mean, const float* rstd,
                         const float* weight, const float* z, const float* bias, ptrdiff_t period, ptrdiff_t repeat,
                         float* gx, float* gz, float* gweight, float* gbeta, float* gbias, ptrdiff_t rows,
                         ptrdiff_t n) {
    if (n < VEC || n > MAX_VECS * VEC || period > MAX_VECS * VEC) return 1;
    row_t row;
    row_layout(&row, n);
#define BACKWARD_ROWS(whole, token)                                                                                    \
    backward_rows_of(gy, gu, y, mean, rstd, weight, z, bias, period, repeat, gx, gz, gweight, gbeta, gbias, rows, n, \
                     &row, whole, token)
    if (n % VEC == 0 && period)
        BACKWARD_ROWS(1, 1);
    else if (n % VEC == 0)
        BACKWARD_ROWS(1, 0);
    else if (period)
        BACKWARD_ROWS(0, 1);
    else
        BACKWARD_ROWS(0, 0);
#undef BACKWARD_ROWS
    return 0;
}

/* ---- rows of n = 4 or 8 channels, VEC / n to a vector ---------------------------------------------------- */

/* Up to VEC floats from p (count of them), zero-padded; and back. */
static inline __attribute__((always_inline)) vec_t get_some(const float* p, ptrdiff_t count) {
    vec_t v = splat(0.0f);
    if (count >= VEC) memcpy(&v, p, sizeof v);
    else
        for (ptrdiff_t l = 0; l < count; ++l) v[l] = p[l];
    return v;
}

static inline __attribute__((always_inline)) void put_some(float* p, ptrdiff_t count, vec_t v) {
    if (count >= VEC) memcpy(p, &v, sizeof v);
    else
        for (ptrdiff_t l = 0; l < count; ++l) p[l] = v[l];
}

/* get_some and put_some where `full` (a constant where inlined) says that count >= VEC. */
static inline __attribute__((always_inline)) vec_t get(const float* p, ptrdiff_t count, const int full) {
    return full ? loadv(p) : get_some(p, count);
}

static inline __attribute__((always_inline)) void put(float* p, ptrdiff_t count, vec_t v, const int full) {
    if (full) storev(p, v);
    else put_some(p, count, v);
}

static inline __attribute__((always_inline)) int packs(ptrdiff_t n) { return n == 4 || n == 8; }

/* The lane shuffles of rows of n channels packed VEC / n to a vector (n a constant where the functions below are
 * inlined), made once per call: partner[i][k] = k xor 2^i; row_of[k] = k / n, the row lane k holds. */
typedef struct {
    ivec_t partner[3], row_of;
} lanes_t;

static lanes_t lanes(int n) {
    lanes_t p;
    for (int k = 0; k < VEC; ++k) {
        for (int i = 0; i < 3; ++i) p.partner[i][k] = k ^ (1 << i);
        p.row_of[k] = k / n;
    }
    return p;
}

/* Each lane's sum over its row's n lanes, in every lane of the row (a butterfly: lane k with lane k xor 1, then
 * k xor 2, ...); per-row values[0 .. count) spread over the lanes of their rows; one lane of each row into
 * values[0 .. count), at most VEC / n of them. */
static inline __attribute__((always_inline)) vec_t row_sums(vec_t v, const lanes_t* p, const int n) {
    for (int i = 0; (1 << i) < n; ++i) v = v + __builtin_shuffle(v, p->partner[i]);
    return v;
}

static inline __attribute__((always_inline)) vec_t spread(const float* values, ptrdiff_t count, const lanes_t* p,
                                                          const int n, const int full) {
    if (full) { /* the vector's VEC / n rows all there: a broadcast of each (a partial load would reach the shuffle
                 * through memory, a stall) */
        vec_t v = splat(values[0]);
        for (int r = 1; r < VEC / n; ++r) v = select(p->row_of == r, splat(values[r]), v);
        return v;
    }
    return __builtin_shuffle(get_some(values, count), p->row_of);
}

static inline __attribute__((always_inline)) void gather_rows(float* values, ptrdiff_t count, vec_t v, const int n,
                                                              const int full) {
    const ptrdiff_t here = full || count >= VEC / n ? VEC / n : count;
    for (ptrdiff_t k = 0; k < here; ++k) values[k] = v[k * n];
}

/* The bias of every element of a period of the stream (period rows, or one row for a channel bias), repeated so that
 * VEC floats can be read from any offset within the period: the bias of a vector where each row has a token of its
 * own (repeat 1) or the bias runs along the channels. */
static void bias_plane(float* plane, const float* bias, ptrdiff_t period, ptrdiff_t n) {
    const ptrdiff_t length = (period ? period : 1) * n;
    for (ptrdiff_t i = 0; i < length + VEC; ++i) {
        const ptrdiff_t e = i % length;
        plane[i] = period ? bias[e / n] : bias[e % n];
    }
}

/* The token bias of each lane of a vector of `here` rows (at most VEC / n) where rows share tokens (repeat > 1),
 * the walk `tok` moved past them: one token's bias in every lane where the rows have one token, as they mostly
 * do, else each row's spread over its lanes. */
static inline __attribute__((always_inline)) vec_t bias_of_runs(const float* bias, tokens_t* tok, ptrdiff_t here,
                                                                const lanes_t* p, const int n) {
    if (tok->within + here < tok->repeat) {
        tok->within += here;
        return splat(bias[tok->token]);
    }
    float values[VEC];
    for (ptrdiff_t k = 0; k < here; ++k, next_row(tok)) values[k] = bias[tok->token];
    return spread(values, here, p, n, 0);
}

/* What a walk over packed rows reads and writes, and where it is: the next vector's offset in the bias plane and
 * the bias's walk over tokens at the next vector's first row. */
typedef struct {
    const float *x, *z, *bias, *plane, *gy, *gu, *y, *mean, *rstd;
    float *out_y, *u, *out_mean, *out_rstd, *gx, *gz;
    ptrdiff_t rows, total_floats, length, period;
    int planar; /* the bias from the plane, else from the runs of rows */
    lanes_t lanes;
    vec_t w, be;
    float eps;
    ptrdiff_t at, advance; /* advance: VEC mod length, the step of `at` from one vector to the next */
    tokens_t tok;
} packed_t;

/* The bias of a packed walk's next vector, whose first row is r0 (moving the walk past it). */
static inline __attribute__((always_inline)) vec_t packed_bias(packed_t* a, ptrdiff_t r0, const int n) {
    const ptrdiff_t per = VEC / n;
    const vec_t b = a->planar ? loadv(a->plane + a->at)
                              : bias_of_runs(a->bias, &a->tok, a->rows - r0 < per ? a->rows - r0 : per, &a->lanes, n);
    a->at += a->advance;
    if (a->at >= a->length) a->at -= a->length;
    return b;
}

/* GROUP vectors of the forward from float f0 (row r00) side by side, each step for all of them before the next, so
 * that their chains overlap; `full` (a constant where inlined): all GROUP vectors are whole. */
static inline __attribute__((always_inline)) void forward_group(packed_t* a, ptrdiff_t f0, ptrdiff_t r00, const int n,
                                                                const int full) {
    const ptrdiff_t per = VEC / n, total = a->total_floats;
    const int g = full ? GROUP : (int)((total - f0 + VEC - 1) / VEC);
    vec_t v[GROUP], m[GROUP], d[GROUP], rs[GROUP];
    ahead(a->x, f0 + AHEAD * 16, GROUP * VEC, total);
    ahead(a->z, f0 + AHEAD * 16, GROUP * VEC, total);
    for (int i = 0; i < g; ++i) {
        const ptrdiff_t f = f0 + i * VEC;
        v[i] = get(a->z + f, total - f, full) + packed_bias(a, r00 + i * per, n);
    }
    for (int i = g; i < GROUP; ++i) v[i] = splat(0.0f);
    gelu(v, GROUP);
    for (int i = 0; i < g; ++i) v[i] = get(a->x + f0 + i * VEC, total - f0 - i * VEC, full) + v[i];
    for (int i = 0; i < g; ++i) put(a->out_y + f0 + i * VEC, total - f0 - i * VEC, v[i], full);
    for (int i = 0; i < g; ++i) m[i] = row_sums(v[i], &a->lanes, n) * (1.0f / (float)n), d[i] = v[i] - m[i];
    for (int i = 0; i < g; ++i)
        rs[i] = 1.0f / vsqrt(row_sums(d[i] * d[i], &a->lanes, n) * (1.0f / (float)n) + a->eps);
    for (int i = 0; i < g; ++i) {
        const ptrdiff_t f = f0 + i * VEC, r0 = r00 + i * per;
        put(a->u + f, total - f, d[i] * rs[i] * a->w + a->be, full);
        if (a->out_mean) gather_rows(a->out_mean + r0, a->rows - r0, m[i], n, full);
        if (a->out_rstd) gather_rows(a->out_rstd + r0, a->rows - r0, rs[i], n, full);
    }
}

static inline __attribute__((always_inline)) void forward_packed_of(packed_t* a, const int n) {
    const ptrdiff_t per = VEC / n, total = a->total_floats;
    ptrdiff_t f0 = 0, r00 = 0;
    for (; f0 + GROUP * VEC <= total; f0 += GROUP * VEC, r00 += GROUP * per) forward_group(a, f0, r00, n, 1);
    if (f0 < total) forward_group(a, f0, r00, n, 0);
}

static int forward_packed(const float* x, const float* z, const float* bias, ptrdiff_t period, ptrdiff_t repeat,
                          const float* weight, const float* beta, float* y, float* u, float* mean, float* rstd,
                          ptrdiff_t rows, int n, float eps) {
    const ptrdiff_t length = (period ? period : 1) * n;
    if (length > MAX_VECS * VEC) return 1;
    float plane[MAX_VECS * VEC + VEC];
    packed_t a = {.x = x, .z = z, .bias = bias, .plane = plane, .out_y = y, .u = u, .out_mean = mean,
                  .out_rstd = rstd, .rows = rows, .total_floats = rows * n, .length = length, .period = period,
                  .planar = !period || repeat == 1, .lanes = lanes(n), .eps = eps, .at = 0, .advance = VEC % length,
                  .tok = tokens_from_start(period, repeat)};
    if (a.planar) bias_plane(plane, bias, period, n);
    for (int k = 0; k < VEC; ++k) a.w[k] = weight[k % n], a.be[k] = beta[k % n];
    if (n == 8)
        forward_packed_of(&a, 8);
    else
        forward_packed_of(&a, 4);
    return 0;
}

/* The backward's sums over a block of packed vectors, by lane, and over everything, in double. */
typedef struct {
    vec_t bw, bbe, bb;
    double accw[VEC], accbe[VEC], accb[MAX_VECS * VEC];
    tokens_t summed; /* the token bias gradient's walk, at the next vector's first row */
} packed_sums_t;

/* GROUP vectors of the backward from float f0 (row r00) side by side, each step for all of them before the next;
 * sums in the vectors' order; `full` as in forward_group. */
static inline __attribute__((always_inline)) void backward_group(packed_t* a, packed_sums_t* sums, ptrdiff_t f0,
                                                                 ptrdiff_t r00, const int n, const int full) {
    const ptrdiff_t per = VEC / n, total = a->total_floats, rows = a->rows;
    const int g = full ? GROUP : (int)((total - f0 + VEC - 1) / VEC);
    vec_t g0[GROUP], h[GROUP], gk[GROUP], t[GROUP];
    ahead(a->gu, f0 + AHEAD * 16, GROUP * VEC, total);
    ahead(a->y, f0 + AHEAD * 16, GROUP * VEC, total);
    ahead(a->z, f0 + AHEAD * 16, GROUP * VEC, total);
    ahead(a->gy, f0 + AHEAD * 16, GROUP * VEC, total);
    for (int i = 0; i < g; ++i) {
        const ptrdiff_t f = f0 + i * VEC, r0 = r00 + i * per, count = total - f;
        const vec_t m = spread(a->mean + r0, rows - r0, &a->lanes, n, full);
        const vec_t rs = spread(a->rstd + r0, rows - r0, &a->lanes, n, full);
        g0[i] = get(a->gu + f, count, full);
        h[i] = (get(a->y + f, count, full) - m) * rs; /* x-hat */
        const vec_t gh = g0[i] * a->w;                /* gradient of x-hat */
        const vec_t c1 = row_sums(gh, &a->lanes, n) * (1.0f / (float)n);
        const vec_t c2 = row_sums(gh * h[i], &a->lanes, n) * (1.0f / (float)n);
        gk[i] = ((gh - c1) - h[i] * c2) * rs;
        if (a->gy) gk[i] = get(a->gy + f, count, full) + gk[i];
    }
    for (int i = 0; i < g; ++i) {
        sums->bw += g0[i] * h[i];
        sums->bbe += g0[i];
    }
    for (int i = 0; i < g; ++i) {
        const ptrdiff_t f = f0 + i * VEC, count = total - f;
        put(a->gx + f, count, gk[i], full);
        t[i] = get(a->z + f, count, full) + packed_bias(a, r00 + i * per, n);
    }
    for (int i = g; i < GROUP; ++i) t[i] = splat(0.0f);
    gelu_grad(t, GROUP);
    for (int i = 0; i < g; ++i) {
        const ptrdiff_t f = f0 + i * VEC;
        t[i] = gk[i] * t[i];
        put(a->gz + f, total - f, t[i], full);
    }
    for (int i = 0; i < g; ++i) {
        const ptrdiff_t r0 = r00 + i * per, here = rows - r0 < per ? rows - r0 : per;
        if (a->period) {
            float row_totals[VEC];
            gather_rows(row_totals, per, row_sums(t[i], &a->lanes, n), n, 1);
            for (ptrdiff_t k = 0; k < here; ++k, next_row(&sums->summed))
                sums->accb[sums->summed.token] += row_totals[k];
        } else {
            sums->bb += t[i];
        }
    }
}

static inline __attribute__((always_inline)) void backward_packed_of(packed_t* a, packed_sums_t* sums, const int n) {
    const ptrdiff_t per = VEC / n, total = a->total_floats;
    ptrdiff_t f0 = 0, r00 = 0;
    while (f0 < total) {
        sums->bw = sums->bbe = sums->bb = splat(0.0f); /* this block's sums, by lane */
        for (int i0 = 0; i0 < BLOCK && f0 < total; i0 += GROUP, f0 += GROUP * VEC, r00 += GROUP * per)
            if (f0 + GROUP * VEC <= total)
                backward_group(a, sums, f0, r00, n, 1);
            else
                backward_group(a, sums, f0, r00, n, 0);
        for (int k = 0; k < VEC; ++k) {
            sums->accw[k] += sums->bw[k];
            sums->accbe[k] += sums->bbe[k];
            sums->accb[k] += a->period ? 0.0 : sums->bb[k];
        }
    }
}

static int backward_packed(const float* gy, const float* gu, const float* y, const float* mean, const float* rstd,
                           const float* weight, const float* z, const float* bias, ptrdiff_t period, ptrdiff_t repeat,
                           float* gx, float* gz, float* gweight, float* gbeta, float* gbias, ptrdiff_t rows, int n) {
    const ptrdiff_t length = (period ? period : 1) * n;
    if (length > MAX_VECS * VEC || period > MAX_VECS * VEC) return 1;
    float plane[MAX_VECS * VEC + VEC];
    packed_t a = {.z = z, .bias = bias, .plane = plane, .gy = gy, .gu = gu, .y = y, .mean = mean, .rstd = rstd,
                  .gx = gx, .gz = gz, .rows = rows, .total_floats = rows * n, .length = length, .period = period,
                  .planar = !period || repeat == 1, .lanes = lanes(n), .at = 0, .advance = VEC % length,
                  .tok = tokens_from_start(period, repeat)};
    if (a.planar) bias_plane(plane, bias, period, n);
    for (int k = 0; k < VEC; ++k) a.w[k] = weight[k % n];
    packed_sums_t sums;
    memset(&sums, 0, sizeof sums);
    sums.summed = tokens_from_start(period, repeat);
    if (n == 8)
        backward_packed_of(&a, &sums, 8);
    else
        backward_packed_of(&a, &sums, 4);
    for (int j = 0; j < n; ++j) {
        double sw = 0.0, sbe = 0.0, sb = 0.0;
        for (int k = j; k < VEC; k += n) sw += sums.accw[k], sbe += sums.accbe[k], sb += sums.accb[k];
        gweight[j] = (float)sw;
        gbeta[j] = (float)sbe;
        if (!period) gbias[j] = (float)sb;
    }
    if (period)
        for (ptrdiff_t j = 0; j < period; ++j) gbias[j] = (float)sums.accb[j];
    return 0;
}

/* ---- entry points ------------------------------------------------------------------------------------------- */

int pkmixer_residual_gelu_norm_forward(const float* x, const float* z, const float* bias, ptrdiff_t period,
                                       ptrdiff_t repeat, const float* weight, const float* beta, float* y, float* u,
                                       float* mean, float* rstd, ptrdiff_t rows, ptrdiff_t n, float eps) {
    if (repeat < 1) return 1;
    if (packs(n))
        return forward_packed(x, z, bias, period, repeat, weight, beta, y, u, mean, rstd, rows, (int)n, eps);
    if (n < 16) return 1;
    return forward_rows(x, z, bias, period, repeat, weight, beta, y, u, mean, rstd, rows, n, eps);
}

int pkmixer_residual_gelu_norm_backward(const float* gy, const float* gu, const float* y, const float* mean,
                                        const float* rstd, const float* weight, const float* z, const float* bias,
                                        ptrdiff_t period, ptrdiff_t repeat, float* gx, float* gz, float* gweight,
                                        float* gbeta, float* gbias, ptrdiff_t rows, ptrdiff_t n) {
    if (repeat < 1) return 1;
    if (packs(n))
        return backward_packed(gy, gu, y, mean, rstd, weight, z, bias, period, repeat, gx, gz, gweight, gbeta, gbias,
                               rows, (int)n);
    if (n < 16) return 1;
    return backward_rows(gy, gu, y, mean, rstd, weight, z, bias, period, repeat, gx, gz, gweight, gbeta, gbias, rows,
                         n);
}
