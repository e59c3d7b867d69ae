#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define BATCH 256
static long rounds;
static void *slots[2][BATCH];
static pthread_barrier_t barrier;
static void *worker(void *arg) {
    long t = (long)arg;
    for (long r = 0; r < rounds; r++) {
        for (int i = 0; i < BATCH; i++) slots[t][i] = malloc(32 + (i & 63));
        pthread_barrier_wait(&barrier);
        /* free the other thread's blocks */
        for (int i = 0; i < BATCH; i++) free(slots[1 - t][i]);
        pthread_barrier_wait(&barrier);
    }
    return NULL;
}
int main(int argc, char **argv) {
    long pairs = argc > 1 ? atol(argv[1]) : 200000;
    rounds = pairs / (2 * BATCH);
    pthread_t th[2];
    struct timespec a, b;
    pthread_barrier_init(&barrier, NULL, 2);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long t = 0; t < 2; t++) pthread_create(&th[t], NULL, worker, (void *)t);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (rounds * 2 * BATCH));
    return 0;
}
