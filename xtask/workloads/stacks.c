#include <stdio.h>
#include <stdlib.h>
static void **keep;
static long at;
__attribute__((noinline)) static void leaf(void) { keep[at++] = malloc(16); }
__attribute__((noinline)) static void b(int d, unsigned bits);
__attribute__((noinline)) static void a(int d, unsigned bits) {
    if (!d) { leaf(); return; }
    if (bits & 1) a(d - 1, bits >> 1); else b(d - 1, bits >> 1);
    __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) static void b(int d, unsigned bits) {
    if (!d) { leaf(); return; }
    if (bits & 1) a(d - 1, bits >> 1); else b(d - 1, bits >> 1);
    __asm__ volatile("" ::: "memory");
}
int main(int argc, char **argv) {
    int depth = atoi(argv[1]);
    long n = 1L << depth;
    keep = malloc(n * sizeof(void *));
    for (long i = 0; i < n; i++) a(depth, (unsigned)i);
    printf("done\n");
    fflush(stdout);
    getchar();
    return keep[0] == NULL;
}
