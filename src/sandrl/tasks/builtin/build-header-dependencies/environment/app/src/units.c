#include "units.h"

#include "config.h"

long to_metres(long units)
{
    return units * METRES_PER_UNIT;
}

int samples_per_line(void)
{
    return SAMPLE_COUNT;
}
