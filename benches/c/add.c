/* The C baseline for the host reduction kernels: `a[i] += b[i]` over float,
 * compiled by tools/bench-kernels with `gcc -O3 -march=native`.
 *
 * Timing method (shared with crates/oxccl-core/examples/kernel_speed.rs, so
 * the two are comparable): for each size S (bytes of ONE buffer: 4 KiB,
 * 256 KiB, 64 MiB), two 64-byte-aligned buffers of S bytes, touched first;
 * one repetition calls the kernel max(16, 1 GiB / S) times and is timed
 * with clock_gettime(CLOCK_MONOTONIC); 9 repetitions. GB/s counts S
 * (the destination's bytes) per call, 1 GB = 1e9 bytes.
 *
 * Output, one line per size: "S best_GBps median_GBps". */
#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define REPS 9

__attribute__((noinline)) void add(float *restrict a, const float *restrict b, size_t n) {
    for (size_t i = 0; i < n; i++) a[i] += b[i];
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(void) {
    const size_t sizes[] = {4096, 256 * 1024, 64 * 1024 * 1024};
    for (int s = 0; s < 3; s++) {
        size_t bytes = sizes[s], n = bytes / sizeof(float);
        float *a, *b;
        if (posix_memalign((void **)&a, 64, bytes) || posix_memalign((void **)&b, 64, bytes)) return 1;
        for (size_t i = 0; i < n; i++) { a[i] = (float)(i % 1000); b[i] = 1e-3f; }
        size_t iters = (size_t)1 << 30;
        iters /= bytes;
        if (iters < 16) iters = 16;
        double gbps[REPS];
        for (int r = 0; r < REPS; r++) {
            double t0 = now();
            for (size_t it = 0; it < iters; it++) {
                add(a, b, n);
                __asm__ volatile("" : : "r"(a), "r"(b) : "memory");
            }
            gbps[r] = (double)bytes * (double)iters / (now() - t0) / 1e9;
        }
        qsort(gbps, REPS, sizeof(double), cmp);
        printf("%zu %.2f %.2f\n", bytes, gbps[REPS - 1], gbps[REPS / 2]);
        free(a);
        free(b);
    }
    return 0;
}
