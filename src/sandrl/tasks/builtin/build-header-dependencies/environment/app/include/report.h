#ifndef REPORT_H
#define REPORT_H

#include "format.h"

/* Print one report line for a named quantity. */
void report_line(const char *name, long value);

#endif
