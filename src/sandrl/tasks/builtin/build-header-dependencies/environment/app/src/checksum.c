#include "checksum.h"

#include <stdio.h>

uint32_t checksum(const long *values, int n)
{
    uint32_t h = 2166136261u;
    char digits[32];
    for (int i = 0; i < n; i++) {
        int len = snprintf(digits, sizeof digits, "%ld;", values[i]);
        for (int k = 0; k < len; k++) {
            h ^= (unsigned char)digits[k];
            h *= 16777619u;
        }
    }
    return h;
}
