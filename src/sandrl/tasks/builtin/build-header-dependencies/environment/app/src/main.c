#include <stdio.h>

#include "checksum.h"
#include "geometry.h"
#include "report.h"
#include "units.h"

int main(void)
{
    long xs[] = {0, 40, 55, 30, -5};
    long ys[] = {0, 0, 25, 45, 20};
    long area = polygon_area(xs, ys, 5);
    long width = to_metres(40);
    long samples = samples_per_line();
    long values[] = {area, width, samples};
    report_line("area", area);
    report_line("width_m", width);
    report_line("samples", samples);
    printf("checksum %08x\n", (unsigned)checksum(values, 3));
    return 0;
}
