/* LayerNorm over the last axis of a row-major (rows, n) float32 matrix, forward and backward, one thread.
 *
 * For the few channels of a narrow Mixer (n < 16), where torch's CPU kernel spends most of its time per row rather
 * than per element. Each row is read once in the forward and once in the backward; the forward stores each row's
 * mean and 1/σ for the backward, which recomputes them where it is given none. Every n below 16 has its own copy
 * of the loops (the compiler unrolls them). From 8 channels up (LANES_FROM) rows go LANES at a time: a group of rows
 * is transposed into vectors, one lane per row, so that the rows' sums over their n channels run side by side
 * rather than as one chain of dependent scalar additions each; the rows left over, and every row below 8 channels,
 * go one at a time. A row's sums run over its channels in the same fixed order in a lane as alone, with no fused
 * multiply-adds (the loader builds with -ffp-contract=off) and with IEEE division and square root, so its output,
 * moments and input gradient do not depend on whether it went in a lane, nor on the x86-64 level. The weight and
 * bias gradients accumulate per block of rows in float - rows one at a time in order; rows in lanes per lane, the
 * lanes then added in order - and the blocks in double, rounded to float at the end.
 */
#include <math.h>
#include <stddef.h>

#define BLOCK 256

static inline __attribute__((always_inline)) void row_moments(const float* x, ptrdiff_t n, float eps, float* mean,
                                                               float* rstd) {
    float s = 0.0f;
    for (ptrdiff_t j = 0; j < n; ++j) s += x[j];
    const float m = s / (float)n;
    float v = 0.0f;
    for (ptrdiff_t j = 0; j < n; ++j) {
        const float d = x[j] - m;
        v += d * d;
    }
    *mean = m;
    *rstd = 1.0f / sqrtf(v / (float)n + eps);
}

#define LANES 8
#ifndef LANES_FROM
#define LANES_FROM 8 /* narrower rows go one at a time */
#endif
typedef float lanes_t __attribute__((vector_size(LANES * sizeof(float))));

/* LANES rows starting at x, transposed: t[j][k] = x[k n + j]; and back. */
static inline __attribute__((always_inline)) void gather(const float* x, ptrdiff_t n, lanes_t* t) {
    for (ptrdiff_t j = 0; j < n; ++j) {
        lanes_t column = {0.0f};
        for (int k = 0; k < LANES; ++k) column[k] = x[k * n + j];
        t[j] = column;
    }
}

static inline __attribute__((always_inline)) void scatter(const lanes_t* t, ptrdiff_t n, float* y) {
    for (ptrdiff_t j = 0; j < n; ++j)
        for (int k = 0; k < LANES; ++k) y[k * n + j] = t[j][k];
}

/* row_moments of the LANES rows of t, one per lane: the same operations in the same order. */
static inline __attribute__((always_inline)) void lane_moments(const lanes_t* t, ptrdiff_t n, float eps,
                                                                lanes_t* mean, lanes_t* rstd) {
    lanes_t s = {0.0f}, v = {0.0f}, root = {0.0f};
    for (ptrdiff_t j = 0; j < n; ++j) s += t[j];
    const lanes_t m = s / (float)n;
    for (ptrdiff_t j = 0; j < n; ++j) {
        const lanes_t d = t[j] - m;
        v += d * d;
    }
    const lanes_t var = v / (float)n + eps;
    for (int k = 0; k < LANES; ++k) root[k] = sqrtf(var[k]);
    *mean = m;
    *rstd = 1.0f / root;
}

static inline __attribute__((always_inline)) void forward_rows(const float* x, const float* weight,
                                                                const float* bias, float* y, float* mean,
                                                                float* rstd, ptrdiff_t rows, ptrdiff_t n, float eps) {
    ptrdiff_t r = 0;
    for (; n >= LANES_FROM && r + LANES <= rows; r += LANES) {
        lanes_t t[16], m, rs;
        gather(x + r * n, n, t);
        lane_moments(t, n, eps, &m, &rs);
        for (ptrdiff_t j = 0; j < n; ++j) t[j] = (t[j] - m) * rs * weight[j] + bias[j];
        scatter(t, n, y + r * n);
        if (mean)
            for (int k = 0; k < LANES; ++k) {
                mean[r + k] = m[k];
                rstd[r + k] = rs[k];
            }
    }
    for (; r < rows; ++r) {
        const float* xr = x + r * n;
        float* yr = y + r * n;
        float m, rs;
        row_moments(xr, n, eps, &m, &rs);
        for (ptrdiff_t j = 0; j < n; ++j) yr[j] = (xr[j] - m) * rs * weight[j] + bias[j];
        if (mean) {
            mean[r] = m;
            rstd[r] = rs;
        }
    }
}

/* grad_x = rstd (g - mean(g) - x̂ mean(g x̂)) with g = grad_y * weight; grad_weight = Σ_rows grad_y x̂,
 * grad_bias = Σ_rows grad_y. */
static inline __attribute__((always_inline)) void backward_rows(const float* grad_y, const float* x,
                                                                 const float* mean, const float* rstd,
                                                                 const float* weight, float* grad_x,
                                                                 float* grad_weight, float* grad_bias,
                                                                 ptrdiff_t rows, ptrdiff_t n, float eps) {
    float gw[16], gb[16];
    double sum_gw[16], sum_gb[16];
    for (ptrdiff_t j = 0; j < n; ++j) sum_gw[j] = sum_gb[j] = 0.0;
    for (ptrdiff_t start = 0; start < rows; start += BLOCK) {
        const ptrdiff_t stop = start + BLOCK < rows ? start + BLOCK : rows;
        for (ptrdiff_t j = 0; j < n; ++j) gw[j] = gb[j] = 0.0f;
        lanes_t gw_lanes[16], gb_lanes[16];
        for (ptrdiff_t j = 0; j < n; ++j) gw_lanes[j] = gb_lanes[j] = (lanes_t){0.0f};
        ptrdiff_t r = start;
        for (; n >= LANES_FROM && r + LANES <= stop; r += LANES) {
            lanes_t gt[16], xt[16], out[16], m = {0.0f}, rs = {0.0f}, a = {0.0f}, c = {0.0f};
            gather(grad_y + r * n, n, gt);
            gather(x + r * n, n, xt);
            if (mean) {
                for (int k = 0; k < LANES; ++k) {
                    m[k] = mean[r + k];
                    rs[k] = rstd[r + k];
                }
            } else {
                lane_moments(xt, n, eps, &m, &rs);
            }
            for (ptrdiff_t j = 0; j < n; ++j) {
                xt[j] = (xt[j] - m) * rs;  /* x̂ */
                const lanes_t g = gt[j] * weight[j];
                a += g;
                c += g * xt[j];
            }
            a /= (float)n;
            c /= (float)n;
            for (ptrdiff_t j = 0; j < n; ++j) {
                out[j] = rs * (gt[j] * weight[j] - a - xt[j] * c);
                xt[j] *= gt[j];  /* grad_y x̂ */
            }
            scatter(out, n, grad_x + r * n);
            for (ptrdiff_t j = 0; j < n; ++j) {
                gw_lanes[j] += xt[j];
                gb_lanes[j] += gt[j];
            }
        }
        if (r > start)  /* the lanes' partial sums, lane by lane, then the rows that went one at a time */
            for (ptrdiff_t j = 0; j < n; ++j)
                for (int k = 0; k < LANES; ++k) {
                    gw[j] += gw_lanes[j][k];
                    gb[j] += gb_lanes[j][k];
                }
        for (; r < stop; ++r) {
            const float* gr = grad_y + r * n;
            const float* xr = x + r * n;
            float* out = grad_x + r * n;
            float m, rs;
            if (mean) {
                m = mean[r];
                rs = rstd[r];
            } else {
                row_moments(xr, n, eps, &m, &rs);
            }
            float xhat[16], g[16];
            float a = 0.0f, c = 0.0f;
            for (ptrdiff_t j = 0; j < n; ++j) {
                xhat[j] = (xr[j] - m) * rs;
                g[j] = gr[j] * weight[j];
            }
            for (ptrdiff_t j = 0; j < n; ++j) {
                a += g[j];
                c += g[j] * xhat[j];
            }
            a /= (float)n;
            c /= (float)n;
            for (ptrdiff_t j = 0; j < n; ++j) {
                out[j] = rs * (g[j] - a - xhat[j] * c);
                gw[j] += gr[j] * xhat[j];
                gb[j] += gr[j];
            }
        }
        for (ptrdiff_t j = 0; j < n; ++j) {
            sum_gw[j] += gw[j];
            sum_gb[j] += gb[j];
        }
    }
    for (ptrdiff_t j = 0; j < n; ++j) {
        grad_weight[j] = (float)sum_gw[j];
        grad_bias[j] = (float)sum_gb[j];
    }
}

#define EACH_WIDTH(CALL) \
    switch (n) { \
        case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; case 4: CALL(4); break; \
        case 5: CALL(5); break; case 6: CALL(6); break; case 7: CALL(7); break; case 8: CALL(8); break; \
        case 9: CALL(9); break; case 10: CALL(10); break; case 11: CALL(11); break; case 12: CALL(12); break; \
        case 13: CALL(13); break; case 14: CALL(14); break; case 15: CALL(15); break; default: return 1; \
    }

/* mean and rstd may be NULL (not stored). Returns 1, doing nothing, unless 1 <= n < 16. */
int pkmixer_layer_norm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean,
                               float* rstd, ptrdiff_t rows, ptrdiff_t n, float eps) {
#define FORWARD(N) forward_rows(x, weight, bias, y, mean, rstd, rows, N, eps)
    EACH_WIDTH(FORWARD)
    return 0;
}

/* mean and rstd: the forward's, or NULL (recomputed). grad_weight and grad_bias are overwritten. Returns 1, doing
 * nothing, unless 1 <= n < 16. */
int pkmixer_layer_norm_backward(const float* grad_y, const float* x, const float* mean, const float* rstd,
                                const float* weight, float* grad_x, float* grad_weight, float* grad_bias,
                                ptrdiff_t rows, ptrdiff_t n, float eps) {
#define BACKWARD(N) backward_rows(grad_y, x, mean, rstd, weight, grad_x, grad_weight, grad_bias, rows, N, eps)
    EACH_WIDTH(BACKWARD)
    return 0;
}
