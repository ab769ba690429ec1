// oxccl device code shared by every kernel: element types and their f32
// conversions, the reduce operators, vector loads and stores, system-scope
// flags, the timer and the per-block cross-rank barrier.
//
// Portable: NVRTC compiles it with -DOXCCL_NVRTC (args.h concatenated before
// it, no system header anywhere); g++ -std=c++20 compiles it for the host
// emulation through host_shim.h, which supplies the CUDA built-ins and the
// primitives below for the host. See cuda/README.md.
#ifndef OXCCL_CUH
#define OXCCL_CUH

#ifndef OXCCL_NVRTC
#include "args.h"
#endif

#if defined(__CUDACC__)
#define OX_DEV __device__ __forceinline__
// Large bodies called from many places: one copy each (NVRTC time, I-cache).
#define OX_NOINLINE __device__ __noinline__
#define OX_UNROLL _Pragma("unroll")
// Block-shared state: one object per block.
#define OX_SHARED(type, name) __shared__ type name
#else
#include "host_shim.h"
#endif


// ---------------------------------------------------------------------------
// Device primitives (the host versions are in host_shim.h).
#if defined(__CUDACC__)
OX_DEV u32 ox_f2u(float f) { return __float_as_uint(f); }
OX_DEV float ox_u2f(u32 u) { return __uint_as_float(u); }
OX_DEV u64 ox_d2u(double d) { return (u64)__double_as_longlong(d); }
// Products that must stay rounded (premul then sum): no contraction to FMA.
OX_DEV float ox_fmul(float a, float b) { return __fmul_rn(a, b); }
OX_DEV double ox_dmul(double a, double b) { return __dmul_rn(a, b); }

// Release store / acquire load at system scope: flags written by other GPUs
// (peer IPC mappings) or read by the host.
OX_DEV void ox_st_release_sys(u64 addr, u64 v) {
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(addr), "l"(v) : "memory");
}
OX_DEV u64 ox_ld_acquire_sys(u64 addr) {
    u64 v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(addr) : "memory");
    return v;
}
OX_DEV u32 ox_ld_relaxed_sys_u32(u64 addr) {
    u32 v;
    asm volatile("ld.relaxed.sys.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
    return v;
}
// Compare-and-swap on the status word (host-mapped memory, written only by
// this device's blocks, so device-scope atomicity is enough), then made
// visible to the host.
OX_DEV u32 ox_cas_u32(u64 addr, u32 expect, u32 v) {
    u32 old;
    asm volatile("atom.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(addr), "r"(expect), "r"(v) : "memory");
    asm volatile("fence.sc.sys;" ::: "memory");
    return old;
}
OX_DEV void ox_fence_sys() { asm volatile("fence.sc.sys;" ::: "memory"); }
// Atomic add on a u64 in this GPU's memory (the program executor's team
// barrier: blocks of one rank only).
OX_DEV void ox_atom_add_u64(u64 addr, u64 v) {
    asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(addr), "l"(v) : "memory");
}
// Plain (device-local) u64 access for the per-block epoch counters.
OX_DEV u64 ox_ld_u64(u64 addr) { return *(volatile u64 *)addr; }
OX_DEV void ox_st_u64(u64 addr, u64 v) { *(volatile u64 *)addr = v; }
// Nanoseconds of a global clock (relative measurements only).
OX_DEV u64 ox_timer_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// Inside a spin loop: nothing on the device (the emulation yields).
OX_DEV void ox_pause() {}
#endif

// ---------------------------------------------------------------------------
// Conversions, bit for bit those of oxccl-core (kernels/fp8.rs, element.rs)
// and the `half` crate.

// f32 -> f16, to nearest even, overflow to infinity; NaN keeps its upper
// payload with the quiet bit set (as half's from_f32 and x86 F16C).
OX_DEV u16 ox_f32_to_f16_soft(float f) {
    const u32 x = ox_f2u(f);
    const u32 sign = x & 0x80000000u, exp = x & 0x7F800000u;
    u32 man = x & 0x007FFFFFu;
    if (exp == 0x7F800000u) return (u16)((sign >> 16) | 0x7C00u | (man ? 0x0200u : 0u) | (man >> 13));
    const u32 hs = sign >> 16;
    const int he = (int)(exp >> 23) - 127 + 15;
    if (he >= 0x1F) return (u16)(hs | 0x7C00u);
    if (he <= 0) {
        if (14 - he > 24) return (u16)hs;
        man |= 0x00800000u;
        u32 hm = man >> (14 - he);
        const u32 rb = 1u << (13 - he);
        if ((man & rb) != 0 && (man & (3 * rb - 1)) != 0) hm++;
        return (u16)(hs | hm);
    }
    u32 r = hs | ((u32)he << 10) | (man >> 13);
    if ((man & 0x1000u) != 0 && (man & (3 * 0x1000u - 1)) != 0) r++;
    return (u16)r;
}

// f16 -> f32 (exact); NaN keeps its payload with the quiet bit set.
OX_DEV float ox_f16_to_f32_soft(u16 h) {
    const u32 sign = (u32)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1F) return ox_u2f(sign | (m ? 0x7FC00000u | (m << 13) : 0x7F800000u));
    if (e != 0) return ox_u2f(sign | ((e + 112) << 23) | (m << 13));
    // Zero or subnormal: m × 2^-24, exact in f32.
    const float v = (float)m * 5.9604644775390625e-8f;
    return ox_u2f(sign | ox_f2u(v));
}

#if defined(__CUDACC__)
// The hardware conversions give the same bits except for NaN payloads, which
// follow the soft conversions' rule (top payload bits kept, quiet bit set).
OX_DEV u16 ox_f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    const u32 x = ox_f2u(f);
    if (f != f) h = (u16)(((x >> 16) & 0x8000u) | 0x7E00u | ((x >> 13) & 0x3FFu));
    return h;
}
OX_DEV float ox_f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    const u32 sign = (u32)(h & 0x8000u) << 16, m = h & 0x3FFu;
    if ((h & 0x7C00u) == 0x7C00u && m != 0) f = ox_u2f(sign | 0x7FC00000u | (m << 13));
    return f;
}
#else
OX_DEV u16 ox_f32_to_f16(float f) { return ox_f32_to_f16_soft(f); }
OX_DEV float ox_f16_to_f32(u16 h) { return ox_f16_to_f32_soft(h); }
#endif

// bf16: the upper half of an f32. Narrowing rounds to nearest even; NaN stays
// NaN with the quiet bit set.
OX_DEV float ox_bf16_to_f32(u16 h) { return ox_u2f((u32)h << 16); }
OX_DEV u16 ox_f32_to_bf16(float f) {
    const u32 x = ox_f2u(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (u16)((x >> 16) | 0x40u);
    return (u16)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// FP8 (OCP): MANT mantissa bits, exponent bias BIAS, MAXC the largest finite
// magnitude's code, INF the infinity code (0 if none). Decoding is exact;
// encoding rounds to nearest even, saturates finite overflow to ±max, maps
// NaN to 0x7F and infinity to ±inf (E5M2) or ±max (E4M3).
template <u32 MANT, u32 BIAS, u32 MAXC, u32 INF>
OX_DEV float ox_fp8_decode(u8 code) {
    const u32 sign = (u32)(code & 0x80u) << 24, mag = code & 0x7Fu;
    u32 bits;
    if (mag < (1u << MANT)) {
        bits = ox_f2u((float)mag * ox_u2f((127u + 1u - BIAS - MANT) << 23));
    } else {
        bits = (mag << (23 - MANT)) + ((127u - BIAS) << 23);
    }
    if (INF != 0 && mag == INF) bits = 0x7F800000u;
    if (INF != 0 ? mag > INF : mag == 0x7Fu) bits = 0x7FC00000u;
    return ox_u2f(sign | bits);
}

template <u32 MANT, u32 BIAS, u32 MAXC, u32 INF>
OX_DEV u8 ox_fp8_encode(float x) {
    const u32 bits = ox_f2u(x);
    const u32 sign = (bits >> 24) & 0x80u, a = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0x7Fu;
    u32 code;
    if (a == 0x7F800000u) {
        code = INF != 0 ? INF : MAXC;
    } else if (a >= (127u + 1u - BIAS) << 23) {
        const u32 shift = 23 - MANT;
        const u32 round = (1u << (shift - 1)) - 1u + ((a >> shift) & 1u);
        code = ((a + round) >> shift) - ((127u - BIAS) << MANT);
        if (code > MAXC) code = MAXC;
    } else {
        // Subnormal or zero: the f32 adder rounds |x| at the format's smallest
        // subnormal quantum; the sum's low bits count the quanta.
        const float magic = ox_u2f((127u + 23u + 1u - BIAS - MANT) << 23);
        code = ox_f2u(ox_u2f(a) + magic) - ox_f2u(magic);
    }
    return (u8)(sign | code);
}

// f64 -> f32 rounded to odd, so that a second rounding to a narrower format
// equals one rounding from the f64; finite values beyond f32's range become
// ±f32 max (so that they saturate rather than overflow).
OX_DEV float ox_f64_to_f32_odd(double x) {
    const u64 xb = ox_d2u(x) & 0x7FFFFFFFFFFFFFFFull;
    if (xb > 0x7FF0000000000000ull) return ox_u2f(0x7FC00000u);
    if (xb == 0x7FF0000000000000ull) return (float)x;
    const double ax = x < 0 ? -x : x;
    if (ax > 3.4028234663852886e38) return ox_u2f((x < 0 ? 0x80000000u : 0u) | 0x7F7FFFFFu);
    const float r = (float)x;
    if ((double)r == x) return r;
    u32 b = ox_f2u(r);
    const double ar = r < 0 ? -(double)r : (double)r;
    if (ar > ax) b -= 1;
    return ox_u2f(b | 1u);
}

// ---------------------------------------------------------------------------
// Element types: ox_dtype<N>::type for oxccl-core's DataType N. Storage S,
// accumulator A (ints: the unsigned type of the width, so that sum/prod
// wrap), compare key C (the exact value, for max/min), and their operations.

#define OXCCL_OP_SUM 0
#define OXCCL_OP_PROD 1
#define OXCCL_OP_MAX 2
#define OXCCL_OP_MIN 3

template <class S_, class U_, bool SIGNED, int N>
struct ox_int_dt {
    typedef S_ S;
    typedef U_ A;
    typedef S_ C;
    static const int dtype = N;
    static OX_DEV A widen(S x) { return (A)x; }
    static OX_DEV S narrow(A a) { return (S)a; }
    static OX_DEV C key(S x) { return x; }
    static OX_DEV bool is_nan(C) { return false; }
    static OX_DEV A add(A a, A b) { return (A)(a + b); }
    static OX_DEV A mul(A a, A b) { return (A)(a * b); }
    // Truncating division (signed types divide as signed).
    static OX_DEV A div(A a, u32 n) {
        if (SIGNED) return (A)(S)((i64)(S)a / (i64)n);
        return (A)((u64)a / (u64)n);
    }
    // A premul scalar: truncated toward zero, saturated to S's range (NaN: 0).
    static OX_DEV A scale(double s) {
        const S lo = SIGNED ? (S)((U_)1 << (sizeof(S) * 8 - 1)) : (S)0;
        const S hi = SIGNED ? (S)(((U_)1 << (sizeof(S) * 8 - 1)) - 1) : (S)~(U_)0;
        if (s != s) return 0;
        if (s <= (double)lo) return (A)lo;
        if (s >= (double)hi) return (A)hi;
        return (A)(S)s;
    }
};

// u8 * u8 promotes to int; these products stay below 2^31.
typedef ox_int_dt<i8, u8, true, 0> ox_i8;
typedef ox_int_dt<u8, u8, false, 1> ox_u8;
typedef ox_int_dt<i32, u32, true, 2> ox_i32;
typedef ox_int_dt<u32, u32, false, 3> ox_u32;
typedef ox_int_dt<i64, u64, true, 4> ox_i64;
typedef ox_int_dt<u64, u64, false, 5> ox_u64;

struct ox_f32 {
    typedef float S;
    typedef float A;
    typedef float C;
    static const int dtype = 7;
    static OX_DEV A widen(S x) { return x; }
    static OX_DEV S narrow(A a) { return a; }
    static OX_DEV C key(S x) { return x; }
    static OX_DEV bool is_nan(C c) { return c != c; }
    static OX_DEV A add(A a, A b) { return a + b; }
    static OX_DEV A mul(A a, A b) { return ox_fmul(a, b); }
    static OX_DEV A div(A a, u32 n) { return a / (float)n; }
    static OX_DEV A scale(double s) { return (float)s; }
};

struct ox_f64 {
    typedef double S;
    typedef double A;
    typedef double C;
    static const int dtype = 8;
    static OX_DEV A widen(S x) { return x; }
    static OX_DEV S narrow(A a) { return a; }
    static OX_DEV C key(S x) { return x; }
    static OX_DEV bool is_nan(C c) { return c != c; }
    static OX_DEV A add(A a, A b) { return a + b; }
    static OX_DEV A mul(A a, A b) { return ox_dmul(a, b); }
    static OX_DEV A div(A a, u32 n) { return a / (double)n; }
    static OX_DEV A scale(double s) { return s; }
};

// Narrow floats: stored as bits, computed in f32, rounded once at the end.
template <class S_, int N, float (*TO)(S_), S_ (*FROM)(float)>
struct ox_narrow_dt {
    typedef S_ S;
    typedef float A;
    typedef float C;
    static const int dtype = N;
    static OX_DEV A widen(S x) { return TO(x); }
    static OX_DEV S narrow(A a) { return FROM(a); }
    static OX_DEV C key(S x) { return TO(x); }
    static OX_DEV bool is_nan(C c) { return c != c; }
    static OX_DEV A add(A a, A b) { return a + b; }
    static OX_DEV A mul(A a, A b) { return ox_fmul(a, b); }
    static OX_DEV A div(A a, u32 n) { return a / (float)n; }
    // The scalar rounded once to the element type, as oxccl-core's from_scalar.
    static OX_DEV A scale(double s) { return TO(FROM(ox_f64_to_f32_odd(s))); }
};

OX_DEV float ox_e4m3_to_f32(u8 c) { return ox_fp8_decode<3, 7, 0x7E, 0>(c); }
OX_DEV u8 ox_f32_to_e4m3(float x) { return ox_fp8_encode<3, 7, 0x7E, 0>(x); }
OX_DEV float ox_e5m2_to_f32(u8 c) { return ox_fp8_decode<2, 15, 0x7B, 0x7C>(c); }
OX_DEV u8 ox_f32_to_e5m2(float x) { return ox_fp8_encode<2, 15, 0x7B, 0x7C>(x); }

typedef ox_narrow_dt<u16, 6, ox_f16_to_f32, ox_f32_to_f16> ox_f16;
typedef ox_narrow_dt<u16, 9, ox_bf16_to_f32, ox_f32_to_bf16> ox_bf16;
typedef ox_narrow_dt<u8, 10, ox_e4m3_to_f32, ox_f32_to_e4m3> ox_e4m3;
typedef ox_narrow_dt<u8, 11, ox_e5m2_to_f32, ox_f32_to_e5m2> ox_e5m2;

// DataType number -> element type.
template <int N> struct ox_dtype;
template <> struct ox_dtype<0> { typedef ox_i8 type; };
template <> struct ox_dtype<1> { typedef ox_u8 type; };
template <> struct ox_dtype<2> { typedef ox_i32 type; };
template <> struct ox_dtype<3> { typedef ox_u32 type; };
template <> struct ox_dtype<4> { typedef ox_i64 type; };
template <> struct ox_dtype<5> { typedef ox_u64 type; };
template <> struct ox_dtype<6> { typedef ox_f16 type; };
template <> struct ox_dtype<7> { typedef ox_f32 type; };
template <> struct ox_dtype<8> { typedef ox_f64 type; };
template <> struct ox_dtype<9> { typedef ox_bf16 type; };
template <> struct ox_dtype<10> { typedef ox_e4m3 type; };
template <> struct ox_dtype<11> { typedef ox_e5m2 type; };

// The binary operators. SUM/PROD combine accumulators; MAX/MIN select one of
// the operands by their keys (fmaxf/fminf: a NaN operand loses unless both
// are NaN, when the first wins; +0 against -0 gives +0 for MAX and -0 for
// MIN in either order, as oxccl-core's kernels: the result does not depend
// on the operands' order). Keys of equal value and different bits are
// zeros of both signs (the integers' keys never are).
template <class T, int OP>
OX_DEV typename T::A ox_combine(typename T::A a, typename T::A b) {
    return OP == OXCCL_OP_PROD ? T::mul(a, b) : T::add(a, b);
}
// Integers: keys that compare equal are equal.
template <class C>
OX_DEV bool ox_negative(C) { return false; }
template <>
OX_DEV bool ox_negative<float>(float c) { return (ox_f2u(c) >> 31) != 0; }
template <>
OX_DEV bool ox_negative<double>(double c) { return (ox_d2u(c) >> 63) != 0; }
template <class T, int OP>
OX_DEV bool ox_keep_first(typename T::C a, typename T::C b) {
    if ((OP == OXCCL_OP_MAX ? a > b : a < b) || T::is_nan(b)) return true;
    if (!(a == b)) return false;
    const bool na = ox_negative(a), nb = ox_negative(b);
    return OP == OXCCL_OP_MAX ? (nb && !na) : (na && !nb);
}

// ---------------------------------------------------------------------------
// Vectors: VB bytes moved by one load or store.
// uint4: CUDA's built-in 16-byte vector (ld.v4/st.v4); host_shim.h defines
// it for the emulation.
typedef uint4 ox_v16;
template <int VB> struct ox_vec;
template <> struct ox_vec<16> { typedef ox_v16 type; };
template <> struct ox_vec<8> { typedef u64 type; };
template <> struct ox_vec<4> { typedef u32 type; };
template <> struct ox_vec<2> { typedef u16 type; };
template <> struct ox_vec<1> { typedef u8 type; };

template <class V> OX_DEV V ox_ld(u64 addr) { return *(const V *)addr; }
template <class V> OX_DEV void ox_st(u64 addr, V v) { *(V *)addr = v; }
#if defined(__CUDACC__)
// A vector assembled from narrower elements would be stored piecewise; these
// keep every store one instruction.
template <> OX_DEV void ox_st<ox_v16>(u64 addr, ox_v16 v) {
    asm volatile("st.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
template <> OX_DEV void ox_st<u64>(u64 addr, u64 v) { asm volatile("st.b64 [%0], %1;" ::"l"(addr), "l"(v) : "memory"); }
template <> OX_DEV void ox_st<u32>(u64 addr, u32 v) { asm volatile("st.b32 [%0], %1;" ::"l"(addr), "r"(v) : "memory"); }
#endif

// ---------------------------------------------------------------------------
// Block-shared state of both kernels: two plans (double-buffered, so one
// __syncthreads per step suffices) and the barrier's failure slots.
struct ox_plan {
    u64 src[OXCCL_MAX_SRCS];
    u64 dst[OXCCL_MAX_SRCS];
    u32 nsrc, ndst;
    u32 pre;  // source 0 is multiplied by the premul scalar
    u32 avg;  // divide the result by this (0: no)
};

struct ox_smem {
    ox_plan plan[2];
    u64 epoch;
    u32 fail[OXCCL_MAX_RANKS];
};

// ---------------------------------------------------------------------------
// Flags and the cross-rank barrier.

// status[0] takes the first failure code.
OX_DEV void ox_set_status(u64 status, u32 code) {
    if (status != 0) ox_cas_u32(status, 0, code);
}

// Waits until the u64 at `flag` is >= value. Returns 0, or the failure: the
// timeout (relative to this call) ran out (1), the host set the abort word
// status[1] (2), or another block already failed (status[0] != 0: its code).
// The deadline and the host-mapped status are checked every 1024 polls.
OX_DEV u32 ox_wait_geq(u64 flag, u64 value, u64 status, u64 timeout_ns) {
    if (ox_ld_acquire_sys(flag) >= value) return 0;
    const u64 t0 = ox_timer_ns();
    for (u32 polls = 1;; polls++) {
        if (ox_ld_acquire_sys(flag) >= value) return 0;
        if ((polls & 1023u) == 0) {
            if (ox_timer_ns() - t0 > timeout_ns) {
                ox_set_status(status, OXCCL_STATUS_TIMEOUT);
                return OXCCL_STATUS_TIMEOUT;
            }
            if (status != 0) {
                if (ox_ld_relaxed_sys_u32(status + 4) != 0) {
                    ox_set_status(status, OXCCL_STATUS_ABORTED);
                    return OXCCL_STATUS_ABORTED;
                }
                const u32 s0 = ox_ld_relaxed_sys_u32(status);
                if (s0 != 0) return s0;
            }
        }
        ox_pause();
    }
}

// Byte offsets in a rank's flag area.
OX_DEV u64 ox_flag_off(u32 sender, u32 block) { return ((u64)sender * OXCCL_MAX_BLOCKS + block) * 8; }
OX_DEV u64 ox_epoch_off(u32 block) { return ((u64)OXCCL_MAX_RANKS * OXCCL_MAX_BLOCKS + block) * 8; }

// Block b of every rank meets: each rank's block b has finished what it did
// before, and its writes are visible to the others. `ep` is this block's
// epoch (the same on every rank), advanced here and stored in the own flag
// area for the next launch. Thread t < nranks, t != rank signals rank t and
// waits for rank t's signal. Returns false when the block must return (a
// wait failed here or in another thread; status[0] holds the code). Every
// thread of the block must call it.
OX_NOINLINE bool ox_barrier(const oxccl_coll_args &a, ox_smem &sh, u64 &ep) {
    const u32 t = threadIdx.x, b = blockIdx.x, n = a.nranks, r = a.rank;
    ep++;
    __syncthreads();
    if (t == 0) ox_st_u64(a.flags[r] + ox_epoch_off(b), ep);
    if (t < n && t != r) {
        ox_st_release_sys(a.flags[t] + ox_flag_off(r, b), ep);
        sh.fail[t] = ox_wait_geq(a.flags[r] + ox_flag_off(t, b), ep, a.status, a.timeout_ns);
    }
    __syncthreads();
    u32 fail = 0;
    for (u32 q = 0; q < n; q++) fail |= q == r ? 0u : sh.fail[q];
    return fail == 0;
}

#endif  // OXCCL_CUH
