/* The columns of a row-major (rows, m) float32 matrix permuted by one permutation for every row, one thread: the
 * gathers of an RP layer (J1, J2, Hayase & Karakida S.13) and, backward, the scatters by the same index.
 *
 *     gather:   y[r, i] = x[r, index[i]]        scatter:   z[r, index[i]] = g[r, i]
 *
 * A row of an RP S-Mixer's stream is S C floats (4 KiB at S = C = 32), so its random reads stay in the first-level
 * cache while the row is read and written once; torch's gather reads the index broadcast over the rows through a
 * general strided loop. Data only moves: the results are torch.gather's and scatter_'s bit for bit. An index
 * entry outside [0, m) makes the call return 1 and write nothing (the caller runs torch's operators, which raise).
 */
#include <stddef.h>
#include <stdint.h>

static int out_of_range(const int64_t* index, ptrdiff_t m) {
    for (ptrdiff_t i = 0; i < m; ++i)
        if (index[i] < 0 || index[i] >= m) return 1;
    return 0;
}

int pkmixer_gather_columns(const float* x, const int64_t* index, float* y, ptrdiff_t rows, ptrdiff_t m) {
    if (out_of_range(index, m)) return 1;
    for (ptrdiff_t r = 0; r < rows; ++r) {
        const float* xr = x + r * m;
        float* yr = y + r * m;
        for (ptrdiff_t i = 0; i < m; ++i) yr[i] = xr[index[i]];
    }
    return 0;
}

int pkmixer_scatter_columns(const float* g, const int64_t* index, float* z, ptrdiff_t rows, ptrdiff_t m) {
    if (out_of_range(index, m)) return 1;
    for (ptrdiff_t r = 0; r < rows; ++r) {
        const float* gr = g + r * m;
        float* zr = z + r * m;
        for (ptrdiff_t i = 0; i < m; ++i) zr[index[i]] = gr[i];
    }
    return 0;
}
