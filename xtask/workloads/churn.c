#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    void *volatile sink;
    struct timespec a, b;
    for (int i = 0; i < 1000; i++) { sink = malloc(64); free(sink); }
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) { sink = malloc(64); free(sink); }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
