#include "report.h"

#include <stdio.h>

void report_line(const char *name, long value)
{
    char buf[128];
    format_field(buf, sizeof buf, name, value);
    puts(buf);
}
