#include "geometry.h"

#include "config.h"

long polygon_area(const long *xs, const long *ys, int n)
{
    long twice = 0;
    for (int i = 0; i < n; i++) {
        int j = (i + 1) % n;
        twice += xs[i] * ys[j] - xs[j] * ys[i];
    }
    if (twice < 0)
        twice = -twice;
    return twice / 2 * GRID_SCALE * GRID_SCALE;
}
