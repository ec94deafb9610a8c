/* Fused kernel sums for localbook: distances, kernel profile and weighted sums in one pass.
 *
 * sums[i, c] += sum_j k_ij v[j, c]  (c < nv),   sums[i, nv] += sum_j k_ij
 *
 * a: (m, d) queries, row-major; bt: (d, n) data, one row per coordinate; vt: (nv, n) values,
 * one row per column; sums: (m, nv + 1). Distances are differences (no |a|^2 + |b|^2 - 2ab
 * cancellation). The data are walked in blocks of BLOCK points that stay in L1 while a chunk
 * of ROWS queries passes over them. With AVX-512 (and at most MAX_VALUES value columns) each
 * query-block pair is one pass in registers (row_block); otherwise portable loops over a block
 * buffer that the compiler vectorizes (block_weights, then the sums).
 *
 * Profiles, with s2 = sum_l (a_l - b_l)^2 of the coordinates as passed:
 *   0 gaussian      2^max(-s2, floor2)  coordinates pre-scaled by sqrt(log2(e)/2), so that
 *                                       -s2 = -u^2/2 * log2(e): exp(-u^2/2) in base 2
 *   1 laplacian     2^max(-sqrt(s2) * log2(e), floor2)            = exp(-u)
 *   2 uniform       1[s2 <= 1]
 *   3 epanechnikov  max(1 - s2, 0)
 *   4 biweight      max(1 - s2, 0)^2
 * floor2 = floor_arg * log2(e): `floor_arg` (natural-log units) keeps results normal numbers
 * (subnormal results are 10-70x slower in hardware and underflow here); the caller redoes
 * rows whose sum is not far above n*exp(floor_arg).
 *
 * 2^y is computed here rather than by libm so that it vectorizes: y = k + f with k = rint(y)
 * and |f| <= 1/2 (exact), a degree-11 Chebyshev fit of 2^f (2e-17 relative), and 2^k put into
 * the exponent (vscalefpd on AVX-512, bit arithmetic elsewhere); within 2 ulp of torch.exp2
 * for y >= floor2 (tests/test_compiled.py). Working in base 2 saves the multiplication by
 * log2(e) and the two-part reduction of a natural-log exp.
 *
 * Build: cc -O3 -march=native -fno-math-errno -fno-trapping-math -fopenmp-simd -shared -fPIC
 * (no -ffast-math: it would change the process's floating-point mode when linked).
 */
#include <math.h>
#include <stdint.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define BLOCK 512
#define ROWS 32
#define MAX_VALUES 8

#define LOG2E 1.4426950408889634
/* near-minimax (Chebyshev) fit of 2^f on [-1/2, 1/2], degree 11: 2e-17 relative */
#define C11 4.4558179083360645e-10
#define C10 7.0741942972885211e-09
#define C9 1.0178057087733941e-07
#define C8 1.3215432535912375e-06
#define C7 1.5252733841556773e-05
#define C6 0.00015403530463724353
#define C5 0.0013333558146406471
#define C4 0.0096181291075872564
#define C3 0.055504108664821625
#define C2 0.24022650695910158
#define C1 0.69314718055994529

static inline double at_least(double x, double lo) { return x < lo ? lo : x; }

/* 2^y for y >= floor2 (a normal result) */
static inline double exp2_normal(double y) {
  const double k = rint(y);
  const double f = y - k;
  double p = C11;
  p = p * f + C10;
  p = p * f + C9;
  p = p * f + C8;
  p = p * f + C7;
  p = p * f + C6;
  p = p * f + C5;
  p = p * f + C4;
  p = p * f + C3;
  p = p * f + C2;
  p = p * f + C1;
  p = p * f + 1.0;
  union {
    int64_t bits;
    double value;
  } scale = {((int64_t)k + 1023) << 52};
  return p * scale.value;
}

#ifdef __AVX512F__
static inline __attribute__((always_inline)) __m512d exp2_8(__m512d y) {
  const __m512d k = _mm512_roundscale_pd(y, _MM_FROUND_TO_NEAREST_INT);
  const __m512d f = _mm512_sub_pd(y, k);
  __m512d p = _mm512_set1_pd(C11);
  p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(C10));
  p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(C9));
  p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(C8));
  p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(C7));
  p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(C6));
  p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(C5));
  p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(C4));
  p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(C3));
  p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(C2));
  p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(C1));
  p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(1.0));
  return _mm512_scalef_pd(p, k);
}

/* the weights of eight pairs from their neg2 = -s2; `profile` is a constant after inlining */
static inline __attribute__((always_inline)) __m512d weights8(__m512d neg2, const int profile,
                                                              __m512d fl2) {
  const __m512d one = _mm512_set1_pd(1.0), zero = _mm512_setzero_pd();
  switch (profile) {
  case 0:
    return exp2_8(_mm512_max_pd(neg2, fl2));
  case 1: {
    const __m512d u = _mm512_sqrt_pd(_mm512_sub_pd(zero, neg2));
    return exp2_8(_mm512_max_pd(_mm512_mul_pd(u, _mm512_set1_pd(-LOG2E)), fl2));
  }
  case 2:
    return _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(neg2, _mm512_set1_pd(-1.0), _CMP_GE_OQ),
                               one);
  case 3:
    return _mm512_max_pd(_mm512_add_pd(one, neg2), zero);
  default: {
    const __m512d w = _mm512_max_pd(_mm512_add_pd(one, neg2), zero);
    return _mm512_mul_pd(w, w);
  }
  }
}

/* out[c] += sum over the block of k_j v[j, c], out[nv] += sum of k_j: sixteen pairs per step
   in registers (two independent vectors: 2^y is a chain of dependent FMAs); the last partial
   step is masked */
static inline __attribute__((always_inline)) void
row_block(const double *a, const double *bt, const double *vt, int64_t n, int64_t j0,
          int64_t nb, int64_t d, int64_t nv, const int profile, __m512d fl2, double *out) {
  __m512d acc[MAX_VALUES + 1];
  for (int64_t c = 0; c <= nv; c++) acc[c] = _mm512_setzero_pd();
  int64_t j = 0;
  for (; j + 16 <= nb; j += 16) {
    __m512d ua = _mm512_setzero_pd(), ub = _mm512_setzero_pd();
    for (int64_t l = 0; l < d; l++) {
      const __m512d al = _mm512_set1_pd(a[l]);
      const double *bl = bt + l * n + j0 + j;
      const __m512d za = _mm512_sub_pd(al, _mm512_loadu_pd(bl));
      const __m512d zb = _mm512_sub_pd(al, _mm512_loadu_pd(bl + 8));
      ua = _mm512_fnmadd_pd(za, za, ua); /* accumulates -s2 */
      ub = _mm512_fnmadd_pd(zb, zb, ub);
    }
    const __m512d wa = weights8(ua, profile, fl2), wb = weights8(ub, profile, fl2);
    acc[nv] = _mm512_add_pd(acc[nv], _mm512_add_pd(wa, wb));
    for (int64_t c = 0; c < nv; c++) {
      const double *vc = vt + c * n + j0 + j;
      acc[c] = _mm512_fmadd_pd(wa, _mm512_loadu_pd(vc), acc[c]);
      acc[c] = _mm512_fmadd_pd(wb, _mm512_loadu_pd(vc + 8), acc[c]);
    }
  }
  for (; j < nb; j += 8) {
    const __mmask8 mask = nb - j >= 8 ? 0xFF : (__mmask8)((1u << (nb - j)) - 1u);
    __m512d u = _mm512_setzero_pd();
    for (int64_t l = 0; l < d; l++) {
      const __m512d z = _mm512_sub_pd(_mm512_set1_pd(a[l]),
                                      _mm512_maskz_loadu_pd(mask, bt + l * n + j0 + j));
      u = _mm512_fnmadd_pd(z, z, u);
    }
    const __m512d w = _mm512_maskz_mov_pd(mask, weights8(u, profile, fl2));
    acc[nv] = _mm512_add_pd(acc[nv], w);
    for (int64_t c = 0; c < nv; c++)
      acc[c] = _mm512_fmadd_pd(w, _mm512_maskz_loadu_pd(mask, vt + c * n + j0 + j), acc[c]);
  }
  for (int64_t c = 0; c <= nv; c++) out[c] += _mm512_reduce_add_pd(acc[c]);
}

static inline __attribute__((always_inline)) void
sums_avx512(const double *a, const double *bt, const double *vt, double *sums, int64_t m,
            int64_t n, int64_t d, int64_t nv, const int profile, double floor2) {
  const __m512d fl2 = _mm512_set1_pd(floor2);
  for (int64_t i0 = 0; i0 < m; i0 += ROWS) {
    const int64_t i1 = i0 + ROWS < m ? i0 + ROWS : m;
    for (int64_t j0 = 0; j0 < n; j0 += BLOCK) {
      const int64_t nb = n - j0 < BLOCK ? n - j0 : BLOCK;
      for (int64_t i = i0; i < i1; i++)
        row_block(a + i * d, bt, vt, n, j0, nb, d, nv, profile, fl2, sums + i * (nv + 1));
    }
  }
}
#endif

/* portable: t[j] = the weight of query a and data point j0 + j */
static void block_weights(const double *a, const double *bt, int64_t n, int64_t j0,
                          int64_t nb, int64_t d, int profile, double floor2, double *t) {
  for (int64_t j = 0; j < nb; j++) t[j] = 0.0;
  for (int64_t l = 0; l < d; l++) {
    const double al = a[l];
    const double *bl = bt + l * n + j0;
#pragma omp simd
    for (int64_t j = 0; j < nb; j++) {
      const double z = al - bl[j];
      t[j] += z * z;
    }
  }
  switch (profile) {
  case 0:
#pragma omp simd
    for (int64_t j = 0; j < nb; j++) t[j] = exp2_normal(at_least(-t[j], floor2));
    break;
  case 1:
#pragma omp simd
    for (int64_t j = 0; j < nb; j++) t[j] = exp2_normal(at_least(-LOG2E * sqrt(t[j]), floor2));
    break;
  case 2:
#pragma omp simd
    for (int64_t j = 0; j < nb; j++) t[j] = t[j] <= 1.0 ? 1.0 : 0.0;
    break;
  case 3:
#pragma omp simd
    for (int64_t j = 0; j < nb; j++) t[j] = at_least(1.0 - t[j], 0.0);
    break;
  default:
#pragma omp simd
    for (int64_t j = 0; j < nb; j++) {
      const double w = at_least(1.0 - t[j], 0.0);
      t[j] = w * w;
    }
  }
}

static void sums_portable(const double *a, const double *bt, const double *vt, double *sums,
                          int64_t m, int64_t n, int64_t d, int64_t nv, int profile,
                          double floor2) {
  double t[BLOCK];
  for (int64_t i0 = 0; i0 < m; i0 += ROWS) {
    const int64_t i1 = i0 + ROWS < m ? i0 + ROWS : m;
    for (int64_t j0 = 0; j0 < n; j0 += BLOCK) {
      const int64_t nb = n - j0 < BLOCK ? n - j0 : BLOCK;
      for (int64_t i = i0; i < i1; i++) {
        block_weights(a + i * d, bt, n, j0, nb, d, profile, floor2, t);
        double *out = sums + i * (nv + 1);
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < nb; j++) s += t[j];
        out[nv] += s;
        for (int64_t c = 0; c < nv; c++) {
          const double *vc = vt + c * n + j0;
          double sc = 0.0;
#pragma omp simd reduction(+ : sc)
          for (int64_t j = 0; j < nb; j++) sc += t[j] * vc[j];
          out[c] += sc;
        }
      }
    }
  }
}

void kernel_sums(const double *a, const double *bt, const double *vt, double *sums,
                 int64_t m, int64_t n, int64_t d, int64_t nv, int profile,
                 double floor_arg) {
  const double floor2 = floor_arg * LOG2E;
#ifdef __AVX512F__
  if (nv <= MAX_VALUES) { /* one fused pass; the profile a constant in each copy */
    switch (profile) {
    case 0:
      sums_avx512(a, bt, vt, sums, m, n, d, nv, 0, floor2);
      return;
    case 1:
      sums_avx512(a, bt, vt, sums, m, n, d, nv, 1, floor2);
      return;
    case 2:
      sums_avx512(a, bt, vt, sums, m, n, d, nv, 2, floor2);
      return;
    case 3:
      sums_avx512(a, bt, vt, sums, m, n, d, nv, 3, floor2);
      return;
    default:
      sums_avx512(a, bt, vt, sums, m, n, d, nv, 4, floor2);
      return;
    }
  }
#endif
  sums_portable(a, bt, vt, sums, m, n, d, nv, profile, floor2);
}

/* The same sums over runs of a cell list: query i sees the data points start[i, r] ...
   start[i, r] + count[i, r] - 1 for r < runs (the data sorted by cell). */
void run_sums(const double *a, const double *bt, const double *vt, double *sums, int64_t m,
              int64_t n, int64_t d, int64_t nv, int profile, double floor_arg,
              const int64_t *start, const int64_t *count, int64_t runs) {
  const double floor2 = floor_arg * LOG2E;
#ifdef __AVX512F__
  if (nv <= MAX_VALUES) {
    const __m512d fl2 = _mm512_set1_pd(floor2);
    for (int64_t i = 0; i < m; i++)
      for (int64_t r = 0; r < runs; r++) {
        const int64_t j0 = start[i * runs + r], nb = count[i * runs + r];
        if (nb <= 0) continue;
        switch (profile) { /* a constant in each inlined copy */
        case 0:
          row_block(a + i * d, bt, vt, n, j0, nb, d, nv, 0, fl2, sums + i * (nv + 1));
          break;
        case 1:
          row_block(a + i * d, bt, vt, n, j0, nb, d, nv, 1, fl2, sums + i * (nv + 1));
          break;
        case 2:
          row_block(a + i * d, bt, vt, n, j0, nb, d, nv, 2, fl2, sums + i * (nv + 1));
          break;
        case 3:
          row_block(a + i * d, bt, vt, n, j0, nb, d, nv, 3, fl2, sums + i * (nv + 1));
          break;
        default:
          row_block(a + i * d, bt, vt, n, j0, nb, d, nv, 4, fl2, sums + i * (nv + 1));
        }
      }
    return;
  }
#endif
  double t[BLOCK];
  for (int64_t i = 0; i < m; i++) {
    double *out = sums + i * (nv + 1);
    for (int64_t r = 0; r < runs; r++) {
      const int64_t first = start[i * runs + r], last = first + count[i * runs + r];
      for (int64_t j0 = first; j0 < last; j0 += BLOCK) {
        const int64_t nb = last - j0 < BLOCK ? last - j0 : BLOCK;
        block_weights(a + i * d, bt, n, j0, nb, d, profile, floor2, t);
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < nb; j++) s += t[j];
        out[nv] += s;
        for (int64_t c = 0; c < nv; c++) {
          const double *vc = vt + c * n + j0;
          double sc = 0.0;
#pragma omp simd reduction(+ : sc)
          for (int64_t j = 0; j < nb; j++) sc += t[j] * vc[j];
          out[c] += sc;
        }
      }
    }
  }
}

/* y[i] = 2^max(x[i], floor2) by the loops' own 2^y (vector and portable), for the tests */
void exp2_array(const double *x, double *y, int64_t n, double floor2) {
  int64_t i = 0;
#ifdef __AVX512F__
  const __m512d fl2 = _mm512_set1_pd(floor2);
  for (; i + 8 <= n; i += 8)
    _mm512_storeu_pd(y + i, exp2_8(_mm512_max_pd(_mm512_loadu_pd(x + i), fl2)));
#endif
  for (; i < n; i++) y[i] = exp2_normal(at_least(x[i], floor2));
}
