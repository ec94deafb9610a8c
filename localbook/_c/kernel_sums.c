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
 * the exponent by bit arithmetic; on AVX-512, y = k/16 + f with |f| <= 1/32, a 16-entry table
 * of 2^(j/16) in two registers and a degree-6 fit (vexp2 there: 12 instructions, not 16).
 * Either is within 2 ulp of torch.exp2 for y >= floor2 (tests/test_compiled.py; measured
 * here: at most 1.0 ulp for the table, 1.45 for the fit). Working in base 2 saves the multiplication by
 * log2(e) and the two-part reduction of a natural-log exp.
 *
 * Build: cc -O3 -march=native -fno-math-errno -fno-trapping-math -fopenmp -shared -fPIC
 * (or -fopenmp-simd where OpenMP is missing: then Python splits the rows over its own threads)
 * (no -ffast-math: it would change the process's floating-point mode when linked).
 */
#include <math.h>
#include <stdint.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__SSE__)
#include <xmmintrin.h>
/* Flush-to-zero while a loop runs (this thread only, restored after). Terms at the floor are
   ~e * 2^-1022: times a value below 1/e, or summed with opposite signs, they give subnormal
   results, each a microcode assist of ~100 cycles (NW at n = m = 30,000, h = 0.01: 55 % of the
   exp roofline instead of 90 %). Flushed results are below 2^-1022, under the floor's own
   error (each floored term is already off by up to e * 2^-1022), which the caller's redo rule
   covers. */
#define FTZ_BEGIN                                                                              \
  const unsigned int saved_csr = _mm_getcsr();                                                 \
  _mm_setcsr(saved_csr | 0x8000u);
#define FTZ_END _mm_setcsr(saved_csr);
#else
#define FTZ_BEGIN
#define FTZ_END
#endif

#define BLOCK 512
#define ROWS 32
#define MAX_VALUES 8
#define MAX_DIM 16 /* coordinates: localbook.compiled.MAX_DIM */
#ifndef UNROLL
#define UNROLL 4 /* independent vectors per step: 2^y is a chain of dependent FMAs */
#endif

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

/* 2^y for y >= floor2 (a normal result). The integer k reaches the exponent field without a
   double-to-int64 conversion, which AVX2 lacks (the loop would not vectorize): adding
   1.5 * 2^52 to the integral k puts k in the low bits of the sum's representation. */
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
    double value;
    int64_t bits;
  } shifted = {k + 6755399441055744.0}, scale;
  scale.bits = (shifted.bits - INT64_C(0x4338000000000000) + 1023) << 52;
  return p * scale.value;
}

/* ---- vector loops: AVX-512 (8 lanes) or AVX2 + FMA (4 lanes), one code over small helpers ---- */
#if defined(__AVX512F__)
#define LB_VECTOR 1
#define VW 8
#define VPD(op) _mm512_##op##_pd
typedef __m512d vd;
#elif defined(__AVX2__) && defined(__FMA__)
#define LB_VECTOR 1
#define VW 4
#define VPD(op) _mm256_##op##_pd
typedef __m256d vd;
#endif
#ifdef LB_VECTOR
/* the operations both widths spell alike (_mm512_add_pd, _mm256_add_pd, ...) */
static inline vd vset(double x) { return VPD(set1)(x); }
static inline vd vzero(void) { return VPD(setzero)(); }
static inline vd vload(const double *p) { return VPD(loadu)(p); }
static inline vd vadd(vd a, vd b) { return VPD(add)(a, b); }
static inline vd vsub(vd a, vd b) { return VPD(sub)(a, b); }
static inline vd vmul(vd a, vd b) { return VPD(mul)(a, b); }
static inline vd vmax(vd a, vd b) { return VPD(max)(a, b); }
static inline vd vfma(vd a, vd b, vd c) { return VPD(fmadd)(a, b, c); }
static inline vd vfnma(vd a, vd b, vd c) { return VPD(fnmadd)(a, b, c); }
static inline vd vsqrt(vd a) { return VPD(sqrt)(a); }
#endif
/* and those they spell differently */
#if defined(__AVX512F__)
static inline vd vround(vd a) { return _mm512_roundscale_pd(a, _MM_FROUND_TO_NEAREST_INT); }
static inline vd vscale2(vd p, vd k) { return _mm512_scalef_pd(p, k); } /* p * 2^k */
static inline vd vindicator_ge(vd a, vd b) { /* 1 where a >= b, else 0 */
  return _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(a, b, _CMP_GE_OQ), vset(1.0));
}
static inline vd vload_first(const double *p, int64_t k) { /* lanes >= k read as 0 */
  return _mm512_maskz_loadu_pd((__mmask8)((1u << k) - 1u), p);
}
static inline vd vkeep_first(vd a, int64_t k) { return _mm512_maskz_mov_pd((__mmask8)((1u << k) - 1u), a); }
static inline double vsum(vd a) { return _mm512_reduce_add_pd(a); }
#elif defined(__AVX2__) && defined(__FMA__)
static inline vd vround(vd a) {
  return _mm256_round_pd(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline vd vscale2(vd p, vd k) { /* p * 2^k for integral k: the exponent by integer ops */
  const __m256i bits = _mm256_castpd_si256(_mm256_add_pd(k, vset(6755399441055744.0)));
  const __m256i e = _mm256_slli_epi64(
      _mm256_add_epi64(_mm256_sub_epi64(bits, _mm256_set1_epi64x(0x4338000000000000LL)),
                       _mm256_set1_epi64x(1023)),
      52);
  return _mm256_mul_pd(p, _mm256_castsi256_pd(e));
}
static inline vd vindicator_ge(vd a, vd b) {
  return _mm256_and_pd(_mm256_cmp_pd(a, b, _CMP_GE_OQ), vset(1.0));
}
static inline __m256i first_lanes(int64_t k) {
  return _mm256_cmpgt_epi64(_mm256_set1_epi64x(k), _mm256_set_epi64x(3, 2, 1, 0));
}
static inline vd vload_first(const double *p, int64_t k) { return _mm256_maskload_pd(p, first_lanes(k)); }
static inline vd vkeep_first(vd a, int64_t k) { return _mm256_and_pd(a, _mm256_castsi256_pd(first_lanes(k))); }
static inline double vsum(vd a) {
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}
#endif

#ifdef LB_VECTOR
#if defined(__AVX512F__)
/* AVX-512: y = k/16 + f with |f| <= 1/32, 2^(k/16) = 2^floor(k/16) * T[k mod 16] from a table
   held in two registers (one permute), 2^f = 1 + f r(f) with r of degree 5 (1.4e-17 relative).
   12 instructions instead of 16 (the degree-11 fit needs 11 FMAs and a two-micro-op
   roundscale); within 2 ulp of torch.exp2 (tests/test_compiled.py). */
static const double EXP2_SIXTEENTHS[16] = {
    1.0, 1.0442737824274138, 1.0905077326652577, 1.1387886347566916,
    1.189207115002721, 1.241857812073484, 1.2968395546510096, 1.3542555469368927,
    1.4142135623730951, 1.4768261459394993, 1.5422108254079407, 1.6104903319492543,
    1.681792830507429, 1.7562521603732995, 1.8340080864093424, 1.9152065613971474};
/* near-minimax fit of (2^f - 1)/f on [-1/32, 1/32] */
#define R5 0.00015403723980749256
#define R4 0.0013333781576784268
#define R3 0.009618129106919537
#define R2 0.0555041086566393
#define R1 0.24022650695910075
#define R0 0.6931471805599457
static inline __attribute__((always_inline)) vd vexp2(vd y) {
  /* adding 1.5 * 2^48 rounds y to a multiple of 1/16 (the sum's last bit is 2^-4), and the
     sum's low mantissa bits are 16 y rounded, in two's complement: its low 4 bits index T */
  const vd shifted = vadd(y, vset(422212465065984.0));
  const vd kr = vsub(shifted, vset(422212465065984.0));
  const vd f = vsub(y, kr); /* exact */
  const vd t = _mm512_permutex2var_pd(_mm512_loadu_pd(EXP2_SIXTEENTHS),
                                      _mm512_castpd_si512(shifted),
                                      _mm512_loadu_pd(EXP2_SIXTEENTHS + 8));
  vd r = vfma(vset(R5), f, vset(R4));
  r = vfma(r, f, vset(R3));
  r = vfma(r, f, vset(R2));
  r = vfma(r, f, vset(R1));
  r = vfma(r, f, vset(R0));
  /* scalef multiplies by 2^floor(kr): kr - floor(kr) = (16 kr mod 16) / 16, T's index */
  return vscale2(vfma(vmul(t, f), r, t), kr);
}
#else
static inline __attribute__((always_inline)) vd vexp2(vd y) {
  const vd k = vround(y);
  const vd f = vsub(y, k);
  /* even and odd coefficients in f^2: two chains of 5 FMAs instead of one of 11 (the loop
     was bound by that chain's latency, not by the number of operations) */
  const vd f2 = vmul(f, f);
  vd e = vset(C10), o = vset(C11);
  e = vfma(e, f2, vset(C8));
  o = vfma(o, f2, vset(C9));
  e = vfma(e, f2, vset(C6));
  o = vfma(o, f2, vset(C7));
  e = vfma(e, f2, vset(C4));
  o = vfma(o, f2, vset(C5));
  e = vfma(e, f2, vset(C2));
  o = vfma(o, f2, vset(C3));
  e = vfma(e, f2, vset(1.0));
  o = vfma(o, f2, vset(C1));
  return vscale2(vfma(o, f, e), k);
}
#endif

/* the weights of VW pairs from neg2 = -s2; `profile` is a constant after inlining */
static inline __attribute__((always_inline)) vd weights(vd neg2, const int profile, vd fl2) {
  switch (profile) {
  case 0:
    return vexp2(vmax(neg2, fl2));
  case 1:
    return vexp2(vmax(vmul(vsqrt(vsub(vzero(), neg2)), vset(-LOG2E)), fl2));
  case 2:
    return vindicator_ge(neg2, vset(-1.0));
  case 3:
    return vmax(vadd(vset(1.0), neg2), vzero());
  default: {
    const vd w = vmax(vadd(vset(1.0), neg2), vzero());
    return vmul(w, w);
  }
  }
}

/* out[c] += sum over the block of k_j v[j, c], out[nv] += sum of k_j: UNROLL * VW pairs per
   step in registers (independent vectors: 2^y is a chain of dependent FMAs; 4 vectors ran
   2-12 % faster than 2 at n = m = 2,000, measured interleaved); the last partial
   vectors are masked */
static inline __attribute__((always_inline)) void
row_block(const double *a, const double *bt, const double *vt, int64_t n, int64_t j0,
          int64_t nb, int64_t d, int64_t nv, const int profile, vd fl2, double *out) {
  vd acc[MAX_VALUES + 1];
  for (int64_t c = 0; c <= nv; c++) acc[c] = vzero();
  int64_t j = 0;
  for (; j + UNROLL * VW <= nb; j += UNROLL * VW) {
    vd u[UNROLL], w[UNROLL];
    for (int r = 0; r < UNROLL; r++) u[r] = vzero();
    for (int64_t l = 0; l < d; l++) {
      const vd al = vset(a[l]);
      const double *bl = bt + l * n + j0 + j;
      for (int r = 0; r < UNROLL; r++) {
        const vd z = vsub(al, vload(bl + r * VW));
        u[r] = vfnma(z, z, u[r]); /* accumulates -s2 */
      }
    }
    for (int r = 0; r < UNROLL; r++) w[r] = weights(u[r], profile, fl2);
    for (int r = 0; r < UNROLL; r++) acc[nv] = vadd(acc[nv], w[r]);
    for (int64_t c = 0; c < nv; c++) {
      const double *vc = vt + c * n + j0 + j;
      for (int r = 0; r < UNROLL; r++) acc[c] = vfma(w[r], vload(vc + r * VW), acc[c]);
    }
  }
  for (; j < nb; j += VW) {
    const int64_t k = nb - j < VW ? nb - j : VW;
    vd u = vzero();
    for (int64_t l = 0; l < d; l++) {
      const vd z = vsub(vset(a[l]), vload_first(bt + l * n + j0 + j, k));
      u = vfnma(z, z, u);
    }
    const vd w = vkeep_first(weights(u, profile, fl2), k);
    acc[nv] = vadd(acc[nv], w);
    for (int64_t c = 0; c < nv; c++)
      acc[c] = vfma(w, vload_first(vt + c * n + j0 + j, k), acc[c]);
  }
  for (int64_t c = 0; c <= nv; c++) out[c] += vsum(acc[c]);
}

static inline __attribute__((always_inline)) void
sums_vector_nv(const double *a, const double *bt, const double *vt, double *sums, int64_t m,
               int64_t n, int64_t d, const int64_t nv, const int profile, double floor2) {
  const vd fl2 = vset(floor2);
  for (int64_t i0 = 0; i0 < m; i0 += ROWS) {
    const int64_t i1 = i0 + ROWS < m ? i0 + ROWS : m;
    for (int64_t j0 = 0; j0 < n; j0 += BLOCK) {
      const int64_t nb = n - j0 < BLOCK ? n - j0 : BLOCK;
      for (int64_t i = i0; i < i1; i++)
        row_block(a + i * d, bt, vt, n, j0, nb, d, nv, profile, fl2, sums + i * (nv + 1));
    }
  }
}

/* with a literal number of value columns the accumulators live in registers (a variable
   count kept them in memory: one value column cost 15 % of the loop's time) */
static inline __attribute__((always_inline)) void
sums_vector(const double *a, const double *bt, const double *vt, double *sums, int64_t m,
            int64_t n, int64_t d, int64_t nv, const int profile, double floor2) {
  /* d = 2 (the book's plane examples, the benchmarks): the coordinate loop unrolled */
  if (d == 2 && nv <= 2) {
    if (nv == 0)
      sums_vector_nv(a, bt, vt, sums, m, n, 2, 0, profile, floor2);
    else if (nv == 1)
      sums_vector_nv(a, bt, vt, sums, m, n, 2, 1, profile, floor2);
    else
      sums_vector_nv(a, bt, vt, sums, m, n, 2, 2, profile, floor2);
    return;
  }
  switch (nv) {
  case 0:
    sums_vector_nv(a, bt, vt, sums, m, n, d, 0, profile, floor2);
    return;
  case 1:
    sums_vector_nv(a, bt, vt, sums, m, n, d, 1, profile, floor2);
    return;
  case 2:
    sums_vector_nv(a, bt, vt, sums, m, n, d, 2, profile, floor2);
    return;
  default:
    sums_vector_nv(a, bt, vt, sums, m, n, d, nv, profile, floor2);
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

/* portable: out[nv] += sum_j t[j] and out[c] += sum_j t[j] v_c[j0 + j] over the block */
static void add_block(const double *t, const double *vt, int64_t n, int64_t j0, int64_t nb,
                      int64_t nv, double *out) {
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
        add_block(t, vt, n, j0, nb, nv, out);
      }
    }
  }
}

/* CALL(k) with the profile k as a literal, so that each inlined copy is specialized for it */
#define WITH_PROFILE(profile, CALL) \
  do {                              \
    switch (profile) {              \
    case 0: CALL(0); break;         \
    case 1: CALL(1); break;         \
    case 2: CALL(2); break;         \
    case 3: CALL(3); break;         \
    default: CALL(4);               \
    }                               \
  } while (0)

void kernel_sums(const double *a, const double *bt, const double *vt, double *sums,
                 int64_t m, int64_t n, int64_t d, int64_t nv, int profile,
                 double floor_arg) {
  const double floor2 = floor_arg * LOG2E;
  FTZ_BEGIN
#ifdef LB_VECTOR
  if (nv <= MAX_VALUES) { /* one fused pass; the profile a constant in each copy */
    /* compact profiles (2-4) mostly run over a cell list (run_sums): one copy each, which
       keeps the build short */
#define VECTOR_SUMS(p)                                             \
  if ((p) < 2)                                                     \
    sums_vector(a, bt, vt, sums, m, n, d, nv, (p), floor2);        \
  else                                                             \
    sums_vector_nv(a, bt, vt, sums, m, n, d, nv, (p), floor2)
    WITH_PROFILE(profile, VECTOR_SUMS);
#undef VECTOR_SUMS
  } else
#endif
    sums_portable(a, bt, vt, sums, m, n, d, nv, profile, floor2);
  FTZ_END
}

/* The same sums over runs of a cell list: query i sees the data points start[i, r] ...
   start[i, r] + count[i, r] - 1 for r < runs (the data sorted by cell). */
void run_sums(const double *a, const double *bt, const double *vt, double *sums, int64_t m,
              int64_t n, int64_t d, int64_t nv, int profile, double floor_arg,
              const int64_t *start, const int64_t *count, int64_t runs) {
  const double floor2 = floor_arg * LOG2E;
#ifdef LB_VECTOR
  if (nv <= MAX_VALUES) {
    const vd fl2 = vset(floor2);
    for (int64_t i = 0; i < m; i++)
      for (int64_t r = 0; r < runs; r++) {
        const int64_t j0 = start[i * runs + r], nb = count[i * runs + r];
        if (nb <= 0) continue;
#define ROW_BLOCK(p) \
  row_block(a + i * d, bt, vt, n, j0, nb, d, nv, (p), fl2, sums + i * (nv + 1))
        WITH_PROFILE(profile, ROW_BLOCK);
#undef ROW_BLOCK
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
        add_block(t, vt, n, j0, nb, nv, out);
      }
    }
  }
}

/* ---- threads: OpenMP over chunks of ROWS queries ----
   Built with -fopenmp the shared object links libgomp.so.1, the soname PyTorch's CPU wheels load
   too: the loader reuses PyTorch's runtime, so these loops run on the intra-op threads PyTorch
   already keeps awake (a second pool of threads would compete with them for the cores). */
int lb_openmp(void) {
#ifdef _OPENMP
  return 1;
#else
  return 0;
#endif
}

void kernel_sums_threads(const double *a, const double *bt, const double *vt, double *sums,
                         int64_t m, int64_t n, int64_t d, int64_t nv, int profile,
                         double floor_arg, int64_t threads) {
  const int64_t pieces = (m + ROWS - 1) / ROWS;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int64_t p = 0; p < pieces; p++) {
    const int64_t lo = p * ROWS, rows = m - lo < ROWS ? m - lo : ROWS;
    kernel_sums(a + lo * d, bt, vt, sums + lo * (nv + 1), rows, n, d, nv, profile, floor_arg);
  }
}

void run_sums_threads(const double *a, const double *bt, const double *vt, double *sums,
                      int64_t m, int64_t n, int64_t d, int64_t nv, int profile,
                      double floor_arg, const int64_t *start, const int64_t *count,
                      int64_t runs, int64_t threads) {
  const int64_t pieces = (m + ROWS - 1) / ROWS;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int64_t p = 0; p < pieces; p++) {
    const int64_t lo = p * ROWS, rows = m - lo < ROWS ? m - lo : ROWS;
    run_sums(a + lo * d, bt, vt, sums + lo * (nv + 1), rows, n, d, nv, profile, floor_arg,
             start + lo * runs, count + lo * runs, runs);
  }
}

/* ---- a call's operands and results in C: at n = m = 2,000 the loop takes ~1.5 ms, and the
   dozen PyTorch operations on small tensors that prepared and finished it took another ~0.4 ---- */

/* out = ((src - center) / h) * scale in float64, src (rows, d) float64 or float32 (f32 = 1)
   at element strides (rs, cs); out is (rows, d), or (d, rows) with transpose. The difference
   and quotient are rounded in src's precision, as the PyTorch engine rounds them. Returns the
   number of rows whose (src - center) / h has a squared norm that is not finite (overflow). */
int64_t scale_points(const void *src, int64_t f32, int64_t rows, int64_t d, int64_t rs,
                     int64_t cs, const double *center, const double *h, double scale,
                     double *out, int64_t transpose) {
  int64_t bad = 0;
  for (int64_t i = 0; i < rows; i++) {
    double s2 = 0.0;
    float s2f = 0.0f;
    for (int64_t l = 0; l < d; l++) {
      double t;
      if (f32) {
        const float tf = (((const float *)src)[i * rs + l * cs] - (float)center[l]) / (float)h[l];
        s2f += tf * tf;
        t = tf;
      } else {
        t = (((const double *)src)[i * rs + l * cs] - center[l]) / h[l];
        s2 += t * t;
      }
      out[transpose ? l * rows + i : i * d + l] = t * scale;
    }
    bad += f32 ? !isfinite(s2f) : !isfinite(s2);
  }
  return bad;
}

/* From sums (m, nv + 1): mean[i, c] = S[i, c] / S[i, nv] and total[i] = S[i, nv] (the caller
   takes its log with PyTorch's vectorized log: libm's scalar log took 40 us for 2,000 rows; an
   empty row, S = 0, has means 0/0 = NaN). Returns the number of rows with S[i, nv] below
   redo_below (near the floor: the caller redoes them). */
int64_t finish_sums(const double *sums, int64_t m, int64_t nv, double redo_below,
                    double *mean, double *total) {
  int64_t redo = 0;
  for (int64_t i = 0; i < m; i++) {
    const double s = sums[i * (nv + 1) + nv];
    total[i] = s;
    for (int64_t c = 0; c < nv; c++) mean[i * nv + c] = sums[i * (nv + 1) + c] / s;
    redo += s < redo_below;
  }
  return redo;
}

/* out[l] = max_i src[i, l] / 2 + min_i src[i, l] / 2 for d <= MAX_DIM: the data's midrange
   (cannot overflow), as localbook.kernels.data_center computes it, in one pass over the rows */
void midrange(const void *src, int64_t f32, int64_t rows, int64_t d, int64_t rs, int64_t cs,
              double *out) {
  double lo[MAX_DIM], hi[MAX_DIM];
  for (int64_t l = 0; l < d; l++) {
    lo[l] = INFINITY;
    hi[l] = -INFINITY;
  }
  for (int64_t i = 0; i < rows; i++)
    for (int64_t l = 0; l < d; l++) {
      const double t =
          f32 ? ((const float *)src)[i * rs + l * cs] : ((const double *)src)[i * rs + l * cs];
      lo[l] = t < lo[l] ? t : lo[l];
      hi[l] = t > hi[l] ? t : hi[l];
    }
  for (int64_t l = 0; l < d; l++)
    out[l] = f32 ? (double)((float)hi[l] * 0.5f + (float)lo[l] * 0.5f) : hi[l] * 0.5 + lo[l] * 0.5;
}

/* A whole dense local mean for rows [0, m) of the queries: each piece of ROWS rows is scaled
   (as scale_points, into a buffer on the stack), summed (kernel_sums) and finished
   (finish_sums) while in cache, on the calling thread. status[0] += rows whose scaled query
   overflowed, status[1] += rows to redo. One C call instead of four: at n = m = 2,000 the
   calls and their small PyTorch operations were 14 % of the time (measured 0.27 of 1.98 ms). */
void local_means(const void *xq, int64_t f32, int64_t rs, int64_t cs, const double *center,
                 const double *h, double scale, const double *bt, const double *vt,
                 double *sums, double *mean, double *total, int64_t m, int64_t n, int64_t d,
                 int64_t nv, int profile, double floor_arg, double redo_below,
                 int64_t *status) {
  double a[ROWS * MAX_DIM];
  for (int64_t lo = 0; lo < m; lo += ROWS) {
    const int64_t rows = m - lo < ROWS ? m - lo : ROWS;
    const void *src = f32 ? (const void *)((const float *)xq + lo * rs)
                          : (const void *)((const double *)xq + lo * rs);
    status[0] += scale_points(src, f32, rows, d, rs, cs, center, h, scale, a, 0);
    double *s = sums + lo * (nv + 1);
    for (int64_t i = 0; i < rows * (nv + 1); i++) s[i] = 0.0;
    kernel_sums(a, bt, vt, s, rows, n, d, nv, profile, floor_arg);
    status[1] += finish_sums(s, rows, nv, redo_below, mean + lo * nv, total + lo);
  }
}

void local_means_threads(const void *xq, int64_t f32, int64_t rs, int64_t cs,
                         const double *center, const double *h, double scale,
                         const double *bt, const double *vt, double *sums, double *mean,
                         double *total, int64_t m, int64_t n, int64_t d, int64_t nv,
                         int profile, double floor_arg, double redo_below, int64_t threads,
                         int64_t *status) {
  const int64_t pieces = (m + ROWS - 1) / ROWS;
  int64_t bad = 0, redo = 0;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1) \
    reduction(+ : bad, redo)
  for (int64_t p = 0; p < pieces; p++) {
    const int64_t lo = p * ROWS;
    int64_t st[2] = {0, 0};
    const void *src = f32 ? (const void *)((const float *)xq + lo * rs)
                          : (const void *)((const double *)xq + lo * rs);
    local_means(src, f32, rs, cs, center, h, scale, bt, vt, sums + lo * (nv + 1),
                mean + lo * nv, total + lo, m - lo < ROWS ? m - lo : ROWS, n, d, nv,
                profile, floor_arg, redo_below, st);
    bad += st[0];
    redo += st[1];
  }
  status[0] += bad;
  status[1] += redo;
}

/* y[i] = 2^max(x[i], floor2) by the loops' own 2^y (vector and portable), for the tests */
void exp2_array(const double *x, double *y, int64_t n, double floor2) {
  int64_t i = 0;
#ifdef LB_VECTOR
  for (; i + VW <= n; i += VW) {
    const vd r = vexp2(vmax(vload(x + i), vset(floor2)));
    for (int64_t l = 0; l < VW; l++) y[i + l] = r[l];
  }
#endif
  for (; i < n; i++) y[i] = exp2_normal(at_least(x[i], floor2));
}
