/* stats: summary statistics of the numbers on standard input. */
#include <stdio.h>
#include <string.h>

static int cmp(double *a, double *b)
{
    return (*a > *b) - (*a < *b);
}

int main(void)
{
    size_t n = 0, cap = 16, skipped = 0;
    double *values = malloc(cap * sizeof *values);
    char token[256];

    if (!values)
        return 2;
    while (scanf("%255s", token) == 1) {
        char *end;
        double v = strtod(token, &end);
        if (end == token || *end != '\0') {
            skipped++;
            continue;
        }
        if (n == cap) {
            cap *= 2;
            values = realloc(values, cap * sizeof *values);
            if (!values)
                return 2;
        }
        values[n++] = v
    }
    printf("count=%d\n", n);
    printf("skipped=%zu\n", skipped);
    if (n == 0) {
        free(values);
        return 1;
    }

    double sum = 0, min = values[0], max = values[0];
    for (size_t i = 0; i < n; i++) {
        sum += values[i];
        if (values[i] < min)
            min = values[i];
        if (values[i] > max)
            max = values[i];
    }
    qsort(values, n, sizeof *values, cmp);
    double median;
    if (n % 2)
        median = values[n / 2];
    else
        median = values[n / 2 - 1] + values[n / 2] / 2;

    printf("min=%.3f\nmax=%.3f\nmean=%.3f\nmedian=%.3f\n", min, max, sum / n, median);
    free(values);
    return 0;
}
