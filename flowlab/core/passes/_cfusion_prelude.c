/* The C prelude of compiled fusion (flowlab/core/passes/_cfusion.py): what every generated kernel
   file starts with. An op's C expression (OpDef.c_expr) may use the macros here; an op with
   OpDef.c_block names one of the float32 functions below, whose loop over a block (FL_BLOCK) is
   <name>_n. FL_DATA_OFFSET is defined in front of this text when a file is generated. */
#include <stdint.h>
#include <string.h>
#define FL_INLINE static inline __attribute__((always_inline))
/* numpy's maximum/minimum: a NaN wins (the first one); otherwise a strict comparison, so of two
   zeros the second argument is the result */
#define FL_MAX(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : (a) > (b) ? (a) : (b))
#define FL_MIN(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : (a) < (b) ? (a) : (b))
#define FL_DATA(o) (*(void *const *)((const char *)(o) + FL_DATA_OFFSET))   /* a numpy array's data */
#define FL_SHIFT 6755399441055744.0   /* 1.5 * 2^52: adding it rounds a double to an integer */

FL_INLINE double fl_double(uint64_t b) { double d; memcpy(&d, &b, 8); return d; }
FL_INLINE uint64_t fl_bits(double d) { uint64_t b; memcpy(&b, &d, 8); return b; }

/* e^r - 1 for |r| <= 0.35: Taylor series to r^10, Horner form (truncation < 3e-13 relative) */
FL_INLINE double fl_expm1_small(double r) {
    double p = 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;    p = p * r + 1.0 / 5040.0;    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;      p = p * r + 1.0 / 24.0;      p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;              p = p * r + 1.0;
    return p * r;
}

/* x = n ln2 + r with n whole and |r| <= ln2/2 (ln2 split in two parts, the first with 21 trailing
   zero bits, so n * hi is exact); returns 2^n and sets *r. For -1000 < x < 1000. */
FL_INLINE double fl_reduce(double x, double *r) {
    double k = x * 1.4426950408889634 + FL_SHIFT;
    double n = k - FL_SHIFT;
    *r = (x - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
    return fl_double((fl_bits(k) - fl_bits(FL_SHIFT) + 1023) << 52);
}

FL_INLINE double fl_exp_d(double x) { double r, s = fl_reduce(x, &r); return s + s * fl_expm1_small(r); }

FL_INLINE float fl_expf(float x) {
    double d = x;
    d = d > 89.0 ? 89.0 : d;        /* e^89 is past float32's largest: rounds to inf */
    d = d < -104.0 ? -104.0 : d;    /* e^-104 is below half the smallest subnormal: rounds to 0 */
    float y = (float)fl_exp_d(d);
    return x != x ? x + x : y;
}

FL_INLINE float fl_sigmoidf(float x) {
    double d = -(double)x;
    d = d > 105.0 ? 105.0 : d;
    d = d < -90.0 ? -90.0 : d;
    float y = (float)(1.0 / (1.0 + fl_exp_d(d)));
    return x != x ? x + x : y;
}

/* tanh|x| = E / (E + 2) with E = e^(2|x|) - 1 = 2^n (e^r - 1) + (2^n - 1), in float32 (twice the
   lanes of double, and tanh is the op long chains are made of): no cancellation anywhere. e^r - 1 is
   r + r^2/2 + r^3 q(r), q fitted for relative error (7e-10 on |r| <= ln2/2). fmaf is exact then
   rounded once, by definition: the same bits from the FMA instruction or from libm without one.
   A NaN passes through. */
FL_INLINE float fl_float(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
FL_INLINE uint32_t fl_fbits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }
FL_INLINE float fl_tanhf(float x) {
    float t = __builtin_fabsf(x);
    t = t > 9.5f ? 9.5f : t;        /* tanh(9.5) rounds to 1 in float32 */
    float u = t + t;
    float k = __builtin_fmaf(u, 1.44269504f, 12582912.0f);   /* 1.5 * 2^23: rounds to a whole n */
    float n = k - 12582912.0f;
    float r = __builtin_fmaf(n, -0.693145752f, u);             /* ln2 in two parts */
    r = __builtin_fmaf(n, -1.42860677e-06f, r);
    float q = 0.00019779f;
    q = __builtin_fmaf(q, r, 0.00139336f);
    q = __builtin_fmaf(q, r, 0.0083335f);
    q = __builtin_fmaf(q, r, 0.04166648f);
    q = __builtin_fmaf(q, r, 0.16666666f);
    float p = __builtin_fmaf(__builtin_fmaf(q, r, 0.5f) * r, r, r);
    float s = fl_float((fl_fbits(k) - fl_fbits(12582912.0f) + 127u) << 23);
    float e = __builtin_fmaf(s, p, s - 1.0f);
    return __builtin_copysignf(e / (e + 2.0f), x);
}

/* log x = e ln2 + log m, m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172,
   odd series to s^17. float32 subnormals are normal doubles, so the exponent field is exact. */
FL_INLINE float fl_logf(float x) {
    double d = x;
    uint64_t b = fl_bits(d);
    double m = fl_double((b & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);
    double e = fl_double(0x4330000000000000ULL | ((b >> 52) & 0x7ff)) - (4503599627370496.0 + 1023.0);
    int big = m > 1.4142135623730951;
    m = big ? 0.5 * m : m;
    e = big ? e + 1.0 : e;
    double s = (m - 1.0) / (m + 1.0), z = s * s;
    double p = 2.0 / 17;
    p = p * z + 2.0 / 15; p = p * z + 2.0 / 13; p = p * z + 2.0 / 11; p = p * z + 2.0 / 9;
    p = p * z + 2.0 / 7;  p = p * z + 2.0 / 5;  p = p * z + 2.0 / 3;  p = p * z + 2.0;
    float y = (float)(e * 0.6931471805599453 + s * p);
    y = x < 0 ? __builtin_nanf("") : y;
    y = x == 0 ? -__builtin_inff() : y;
    y = x == __builtin_inff() ? x : y;
    return x != x ? x + x : y;
}
#define FL_BLOCK(name) static void __attribute__((noinline)) name##_n(int64_t m, const float *restrict a, \
                                                                     float *restrict y) { \
    for (int64_t i = 0; i < m; i++) y[i] = name(a[i]); }
FL_BLOCK(fl_expf)
FL_BLOCK(fl_logf)
FL_BLOCK(fl_tanhf)
FL_BLOCK(fl_sigmoidf)
#define FL_ABS_float(a) __builtin_fabsf(a)
#define FL_ABS_double(a) __builtin_fabs(a)
#define FL_SQRT_float(a) __builtin_sqrtf(a)
#define FL_SQRT_double(a) __builtin_sqrt(a)
