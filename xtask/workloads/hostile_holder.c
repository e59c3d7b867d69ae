#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static void *volatile *keep;
#define SITE(n) __attribute__((noinline)) static void *site##n(size_t s) { return malloc(s + n); }
SITE(0) SITE(1) SITE(2) SITE(3) SITE(4) SITE(5) SITE(6) SITE(7)
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    keep = calloc(n, sizeof(void *));
    for (long i = 0; i < n; i++) {
        size_t s = 64 + (i * 97) % 4096;
        switch (i % 8) {
        case 0: keep[i] = site0(s); break; case 1: keep[i] = site1(s); break;
        case 2: keep[i] = site2(s); break; case 3: keep[i] = site3(s); break;
        case 4: keep[i] = site4(s); break; case 5: keep[i] = site5(s); break;
        case 6: keep[i] = site6(s); break; default: keep[i] = site7(s); break;
        }
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) pause();
}
