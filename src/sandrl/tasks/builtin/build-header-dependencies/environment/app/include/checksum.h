#ifndef CHECKSUM_H
#define CHECKSUM_H

#include <stdint.h>

/* FNV-1a over the decimal digits of the values. */
uint32_t checksum(const long *values, int n);

#endif
