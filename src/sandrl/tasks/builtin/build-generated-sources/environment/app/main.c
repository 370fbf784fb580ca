/* lookup X: the sum (mod 2^64) of every mixing function applied to X, in hex. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "table.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: lookup X\n");
        return 2;
    }
    uint64_t x = strtoull(argv[1], NULL, 10), total = 0;
    for (int i = 0; i < NFUNCS; i++)
        total += TABLE[i](x);
    printf("%016" PRIx64 "\n", total);
    return 0;
}
