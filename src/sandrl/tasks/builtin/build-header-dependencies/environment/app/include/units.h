#ifndef UNITS_H
#define UNITS_H

/* Convert grid units to metres. */
long to_metres(long units);

/* Number of samples per survey line. */
int samples_per_line(void);

#endif
