/* Fused kernel sums for localbook: distances, kernel profile and weighted sums in one pass.
 *
 * sums[i, c] = sum_j k(|a_i - b_j|^2) v[j, c]  (c < nv),   sums[i, nv] = sum_j k(|a_i - b_j|^2)
 *
 * a: (m, d) scaled queries, row-major; bt: (d, n) scaled data, one row per coordinate;
 * vt: (nv, n) values, one row per column; sums: (m, nv + 1), accumulated into (+=).
 * Distances are differences (no |a|^2 + |b|^2 - 2ab cancellation). The data are walked in
 * blocks of BLOCK points that stay in L1 while a chunk of ROWS queries passes over them.
 *
 * Profiles (u2 = squared scaled distance):
 *   0 gaussian      exp(max(-u2/2, floor))
 *   1 laplacian     exp(max(-sqrt(u2), floor))
 *   2 uniform       1[u2 <= 1]
 *   3 epanechnikov  max(1 - u2, 0)
 *   4 biweight      max(1 - u2, 0)^2
 * `floor` keeps exp's argument where its result is a normal number (subnormal results are
 * 10-70x slower in hardware exp and underflow here); the caller redoes rows whose sum is
 * not far above n*exp(floor).
 *
 * exp is computed here rather than by libm so that the loop vectorizes: x = k ln2 + r with
 * |r| <= ln2/2 (Cody-Waite, two-part ln2), a degree-11 Chebyshev fit of e^r (2e-17 relative),
 * and 2^k put into the exponent bits (vscalefpd on AVX-512, where two vectors are interleaved
 * by hand; the compiler vectorizes the portable loop elsewhere); within 2 ulp of torch.exp for arguments >= floor
 * (tests/test_compiled.py), where 2^k is a normal number.
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

#define LOG2E 1.4426950408889634
#define LN2_HI 6.93147180369123816490e-01 /* ln 2 in two parts: k * LN2_HI is exact */
#define LN2_LO 1.90821492927058770002e-10
/* near-minimax (Chebyshev) fit of e^r on [-ln2/2, ln2/2], degree 11: 2e-17 relative */
#define C11 2.5110037605963777e-08
#define C10 2.7632639639041029e-07
#define C9 2.755724091857897e-06
#define C8 2.4801485482328494e-05
#define C7 0.00019841269890047113
#define C6 0.0013888888952314775
#define C5 0.0083333333333196011
#define C4 0.041666666666488099
#define C3 0.1666666666666668
#define C2 0.50000000000000189

static inline double exp_normal(double x) {
  const double kf = rint(x * LOG2E);
  const double r = (x - kf * LN2_HI) - kf * LN2_LO;
  double p = C11;
  p = p * r + C10;
  p = p * r + C9;
  p = p * r + C8;
  p = p * r + C7;
  p = p * r + C6;
  p = p * r + C5;
  p = p * r + C4;
  p = p * r + C3;
  p = p * r + C2;
  p = p * r + 1.0;
  p = p * r + 1.0;
  union {
    int64_t bits;
    double value;
  } scale = {((int64_t)kf + 1023) << 52};
  return p * scale.value;
}

static inline double at_least(double x, double lo) { return x < lo ? lo : x; }

/* t[j] = exp(max(scale * t[j], floor_arg)), j < nb */
static void exp_block(double *t, int64_t nb, double scale, double floor_arg) {
  int64_t j = 0;
#ifdef __AVX512F__
  /* the same algorithm by hand: two independent vectors per step (the polynomial is a
     chain of dependent FMAs) and vscalefpd for the 2^k, which the compiler does not emit */
  const __m512d fl = _mm512_set1_pd(floor_arg), sv = _mm512_set1_pd(scale);
  const __m512d l2e = _mm512_set1_pd(LOG2E), hi = _mm512_set1_pd(LN2_HI),
                lo = _mm512_set1_pd(LN2_LO);
  for (; j + 16 <= nb; j += 16) {
    const __m512d xa = _mm512_max_pd(_mm512_mul_pd(_mm512_loadu_pd(t + j), sv), fl);
    const __m512d xb = _mm512_max_pd(_mm512_mul_pd(_mm512_loadu_pd(t + j + 8), sv), fl);
    const __m512d ka = _mm512_roundscale_pd(_mm512_mul_pd(xa, l2e), _MM_FROUND_TO_NEAREST_INT);
    const __m512d kb = _mm512_roundscale_pd(_mm512_mul_pd(xb, l2e), _MM_FROUND_TO_NEAREST_INT);
    const __m512d ra = _mm512_fnmadd_pd(ka, lo, _mm512_fnmadd_pd(ka, hi, xa));
    const __m512d rb = _mm512_fnmadd_pd(kb, lo, _mm512_fnmadd_pd(kb, hi, xb));
    __m512d pa = _mm512_set1_pd(C11), pb = pa;
#define LB_STEP(c)                                                                           \
  pa = _mm512_fmadd_pd(pa, ra, _mm512_set1_pd(c));                                           \
  pb = _mm512_fmadd_pd(pb, rb, _mm512_set1_pd(c));
    LB_STEP(C10) LB_STEP(C9) LB_STEP(C8) LB_STEP(C7) LB_STEP(C6) LB_STEP(C5)
    LB_STEP(C4) LB_STEP(C3) LB_STEP(C2) LB_STEP(1.0) LB_STEP(1.0)
#undef LB_STEP
    _mm512_storeu_pd(t + j, _mm512_scalef_pd(pa, ka));
    _mm512_storeu_pd(t + j + 8, _mm512_scalef_pd(pb, kb));
  }
#endif
#pragma omp simd
  for (int64_t i = j; i < nb; i++) t[i] = exp_normal(at_least(scale * t[i], floor_arg));
}

/* one query against one block: t[j] = k(|a - b_j|^2) */
static void block_weights(const double *a, const double *bt, int64_t n, int64_t j0,
                          int64_t nb, int64_t d, int profile, double floor_arg,
                          double *t) {
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
    exp_block(t, nb, -0.5, floor_arg);
    break;
  case 1:
#pragma omp simd
    for (int64_t j = 0; j < nb; j++) t[j] = sqrt(t[j]);
    exp_block(t, nb, -1.0, floor_arg);
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

void kernel_sums(const double *a, const double *bt, const double *vt, double *sums,
                 int64_t m, int64_t n, int64_t d, int64_t nv, int profile,
                 double floor_arg) {
  double t[BLOCK];
  for (int64_t i0 = 0; i0 < m; i0 += ROWS) {
    const int64_t i1 = i0 + ROWS < m ? i0 + ROWS : m;
    for (int64_t j0 = 0; j0 < n; j0 += BLOCK) {
      const int64_t nb = n - j0 < BLOCK ? n - j0 : BLOCK;
      for (int64_t i = i0; i < i1; i++) {
        block_weights(a + i * d, bt, n, j0, nb, d, profile, floor_arg, t);
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

/* y[i] = exp(max(x[i], floor_arg)): the loop's exp by itself, for the tests */
void exp_array(const double *x, double *y, int64_t n, double floor_arg) {
  double t[BLOCK];
  for (int64_t j0 = 0; j0 < n; j0 += BLOCK) {
    const int64_t nb = n - j0 < BLOCK ? n - j0 : BLOCK;
    for (int64_t j = 0; j < nb; j++) t[j] = x[j0 + j];
    exp_block(t, nb, 1.0, floor_arg);
    for (int64_t j = 0; j < nb; j++) y[j0 + j] = t[j];
  }
}
