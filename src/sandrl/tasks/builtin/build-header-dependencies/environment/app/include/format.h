#ifndef FORMAT_H
#define FORMAT_H

#include <stddef.h>

#define FIELD_WIDTH 12

/* Write "name: value" padded to FIELD_WIDTH into buf. */
void format_field(char *buf, size_t size, const char *name, long value);

#endif
