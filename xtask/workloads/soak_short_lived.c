#include <stdlib.h>
__attribute__((noinline)) static void *site_a(int i) { return malloc(32 + i); }
__attribute__((noinline)) static void *site_b(int i) { return calloc(4, 16 + i); }
int main(void) {
    void *p[200];
    for (int i = 0; i < 200; i++) p[i] = (i % 2) ? site_a(i) : site_b(i);
    for (int i = 0; i < 200; i += 2) free(p[i]);
    return p[1] == NULL;
}
