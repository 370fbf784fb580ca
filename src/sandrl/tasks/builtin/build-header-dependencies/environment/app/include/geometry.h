#ifndef GEOMETRY_H
#define GEOMETRY_H

/* Area in grid cells of a polygon given by n (x, y) vertices, scaled by GRID_SCALE. */
long polygon_area(const long *xs, const long *ys, int n);

#endif
