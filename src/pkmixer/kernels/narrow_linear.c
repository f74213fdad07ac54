/* A Dense over rows of n = 4 or 8 channels, without its bias, forward and backward, one thread.
 *
 * For a row-major (rows, n) float32 x and an (n, n) weight w (out, in, as torch's Linear holds it):
 *     forward    y = x wᵀ          y[r][o] = sum_i x[r][i] w[o][i]
 *     backward   gx = gy w         gx[r][i] = sum_o gy[r][o] w[o][i]
 *                gw = gyᵀ x        gw[o][i] = sum_r gy[r][o] x[r][i]
 * A BLAS GEMM with an inner size of 4 or 8 spends most of its time outside its multiply-adds (docs/performance.md,
 * fast path 10); here the rows are packed VEC / n to a vector as they lie in memory, and each output vector is n
 * multiply-adds of a weight column (lane l: w[l mod n][i]) with channel i of each lane's row, spread over the row's
 * lanes by one shuffle. Each y and gx element sums its n terms in the order i = 0, 1, ... (o for gx) with separate
 * multiplies and adds (-ffp-contract=off, the loader's flags), so they do not depend on the vector width or the
 * x86-64 level; gw sums over rows in float per block of rows by lane and the blocks in double, so builds of
 * another vector width may differ from each other in its last bits.
 */
#include <stddef.h>
#include <string.h>

#ifndef VEC
#ifdef __AVX512F__
#define VEC 16
#else
#define VEC 8
#endif
#endif
#define BLOCK 256 /* vectors whose weight gradient is summed in float */
typedef float vec_t __attribute__((vector_size(VEC * sizeof(float))));
typedef int ivec_t __attribute__((vector_size(VEC * sizeof(int))));

static inline __attribute__((always_inline)) vec_t load_some(const float* p, ptrdiff_t count) {
    vec_t v = {0.0f};
    if (count >= VEC) memcpy(&v, p, sizeof v);
    else
        for (ptrdiff_t l = 0; l < count; ++l) v[l] = p[l];
    return v;
}

static inline __attribute__((always_inline)) void store_some(float* p, ptrdiff_t count, vec_t v) {
    if (count >= VEC) memcpy(p, &v, sizeof v);
    else
        for (ptrdiff_t l = 0; l < count; ++l) p[l] = v[l];
}

/* channel[i][l]: the lane of channel i of lane l's row, (l / n) n + i. */
static void channel_lanes(ivec_t* channel, int n) {
    for (int i = 0; i < n; ++i)
        for (int l = 0; l < VEC; ++l) channel[i][l] = (l / n) * n + i;
}

/* out = x m for packed rows, m an (n, n) matrix read as m[a][b] at m + a * sa + b * sb: lane l of the output sums
 * over i of x[row][i] m[i][l mod n]. */
static inline __attribute__((always_inline)) void rows_times(const float* x, const float* m, ptrdiff_t sa,
                                                             ptrdiff_t sb, float* out, ptrdiff_t rows, const int n) {
    ivec_t channel[8];
    vec_t column[8];
    channel_lanes(channel, n);
    for (int i = 0; i < n; ++i)
        for (int l = 0; l < VEC; ++l) column[i][l] = m[i * sa + (l % n) * sb];
    const ptrdiff_t total = rows * n;
    for (ptrdiff_t f = 0; f < total; f += VEC) {
        const vec_t v = load_some(x + f, total - f);
        vec_t acc = __builtin_shuffle(v, channel[0]) * column[0];
        for (int i = 1; i < n; ++i) acc = acc + __builtin_shuffle(v, channel[i]) * column[i];
        store_some(out + f, total - f, acc);
    }
}

int pkmixer_narrow_linear_forward(const float* x, const float* weight, float* y, ptrdiff_t rows, ptrdiff_t n) {
    /* y[r][o] = sum_i x[r][i] w[o][i]: m[i][o] = w[o][i] */
    if (n == 4) rows_times(x, weight, 1, 4, y, rows, 4);
    else if (n == 8) rows_times(x, weight, 1, 8, y, rows, 8);
    else return 1;
    return 0;
}

static inline __attribute__((always_inline)) void weight_grad(const float* gy, const float* x, float* gweight,
                                                              ptrdiff_t rows, const int n) {
    ivec_t channel[8];
    channel_lanes(channel, n);
    double total[8][VEC] = {{0}};
    const ptrdiff_t floats = rows * n;
    for (ptrdiff_t start = 0; start < floats; start += BLOCK * VEC) {
        const ptrdiff_t end = start + BLOCK * VEC < floats ? start + BLOCK * VEC : floats;
        vec_t acc[8] = {{0.0f}};
        for (ptrdiff_t f = start; f < end; f += VEC) {
            /* lane l: gy[row][l mod n] x[row][i], summed into gw[l mod n][i] */
            const vec_t g = load_some(gy + f, floats - f), v = load_some(x + f, floats - f);
            for (int i = 0; i < n; ++i) acc[i] = acc[i] + g * __builtin_shuffle(v, channel[i]);
        }
        for (int i = 0; i < n; ++i)
            for (int l = 0; l < VEC; ++l) total[i][l] += acc[i][l];
    }
    for (int o = 0; o < n; ++o)
        for (int i = 0; i < n; ++i) {
            double s = 0.0;
            for (int l = o; l < VEC; l += n) s += total[i][l];
            gweight[o * n + i] = (float)s;
        }
}

int pkmixer_narrow_linear_backward(const float* gy, const float* x, const float* weight, float* gx, float* gweight,
                                   ptrdiff_t rows, ptrdiff_t n) {
    /* gx[r][i] = sum_o gy[r][o] w[o][i]: m[o][i] = w[o][i]; gx or gweight may be NULL (not needed) */
    if (n != 4 && n != 8) return 1;
    if (gx) {
        if (n == 4) rows_times(gy, weight, 4, 1, gx, rows, 4);
        else rows_times(gy, weight, 8, 1, gx, rows, 8);
    }
    if (gweight) {
        if (n == 4) weight_grad(gy, x, gweight, rows, 4);
        else weight_grad(gy, x, gweight, rows, 8);
    }
    return 0;
}
