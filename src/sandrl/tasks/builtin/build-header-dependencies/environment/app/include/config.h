#ifndef CONFIG_H
#define CONFIG_H

/* Tunables of the survey tool. */
#define GRID_SCALE 3
#define METRES_PER_UNIT 250
#define SAMPLE_COUNT 64

#endif
