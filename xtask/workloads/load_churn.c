#include <stdlib.h>
#include <unistd.h>
#define SLOTS 20000
static void *ring[SLOTS];
__attribute__((noinline)) static void *small(int i) { return malloc(16 + i % 64); }
__attribute__((noinline)) static void *medium(int i) { return malloc(512 + i % 512); }
__attribute__((noinline)) static void *zeroed(int i) { return calloc(1, 64 + i % 128); }
__attribute__((noinline)) static void *grown(void *p, int i) { return realloc(p, 128 + i % 256); }
int main(void) {
    for (unsigned long i = 0;; i++) {
        unsigned slot = i % SLOTS;
        free(ring[slot]);
        switch (i % 4) {
        case 0: ring[slot] = small(i); break;
        case 1: ring[slot] = medium(i); break;
        case 2: ring[slot] = zeroed(i); break;
        default: ring[slot] = grown(small(i), i); break;
        }
        if (i % 2000 == 0) usleep(10000);
    }
}
