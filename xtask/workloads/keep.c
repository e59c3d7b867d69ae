#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    void **keep = malloc(n * sizeof(void *));
    for (long i = 0; i < n; i++) keep[i] = malloc(16 + (i & 15));
    printf("done\n");
    fflush(stdout);
    getchar();
    return keep[0] == NULL;
}
