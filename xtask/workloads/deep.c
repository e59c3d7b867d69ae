#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static long n;
static void *volatile sink;
__attribute__((noinline)) static double run(void) {
    struct timespec a, b;
    /* 100 ms of warm-up: tracerd has seen the process and given the
       unwinder its mappings before the timing starts. */
    clock_gettime(CLOCK_MONOTONIC, &a);
    do {
        for (int i = 0; i < 1000; i++) { sink = malloc(64); free(sink); }
        clock_gettime(CLOCK_MONOTONIC, &b);
    } while ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec) < 1e8);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) { sink = malloc(64); free(sink); }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
}
__attribute__((noinline)) static double deep(int d) {
    double r = d == 0 ? run() : deep(d - 1);
    __asm__ volatile("" ::: "memory");
    return r;
}
int main(int argc, char **argv) {
    n = argc > 1 ? atol(argv[1]) : 50000;
    int d = argc > 2 ? atoi(argv[2]) : 80;
    printf("%.1f\n", deep(d));
    return 0;
}
