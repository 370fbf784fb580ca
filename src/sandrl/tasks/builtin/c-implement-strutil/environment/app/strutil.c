#include "strutil.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

char *su_trim(char *s)
{
    (void)s;
    return NULL; /* TODO */
}

size_t su_count_words(const char *s)
{
    (void)s;
    return 0; /* TODO */
}

char *su_join(const char *const *parts, size_t n, const char *sep)
{
    (void)parts;
    (void)n;
    (void)sep;
    return NULL; /* TODO */
}

char *su_replace_all(const char *s, const char *from, const char *to)
{
    (void)s;
    (void)from;
    (void)to;
    return NULL; /* TODO */
}
