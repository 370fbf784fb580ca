#include "format.h"

#include <stdio.h>

void format_field(char *buf, size_t size, const char *name, long value)
{
    snprintf(buf, size, "%-*s %ld", FIELD_WIDTH, name, value);
}
