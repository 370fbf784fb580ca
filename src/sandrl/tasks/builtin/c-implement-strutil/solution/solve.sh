#!/bin/bash
set -euo pipefail
cat > /workspace/strutil.c <<'C'
#include "strutil.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

char *su_trim(char *s)
{
    while (*s && isspace((unsigned char)*s))
        s++;
    size_t len = strlen(s);
    while (len > 0 && isspace((unsigned char)s[len - 1]))
        len--;
    s[len] = '\0';
    return s;
}

size_t su_count_words(const char *s)
{
    size_t n = 0;
    int in_word = 0;
    for (; *s; s++) {
        if (isspace((unsigned char)*s)) {
            in_word = 0;
        } else if (!in_word) {
            in_word = 1;
            n++;
        }
    }
    return n;
}

char *su_join(const char *const *parts, size_t n, const char *sep)
{
    size_t seplen = strlen(sep), total = 1;
    for (size_t i = 0; i < n; i++)
        total += strlen(parts[i]) + (i ? seplen : 0);
    char *out = malloc(total);
    if (!out)
        return NULL;
    char *p = out;
    for (size_t i = 0; i < n; i++) {
        if (i) {
            memcpy(p, sep, seplen);
            p += seplen;
        }
        size_t len = strlen(parts[i]);
        memcpy(p, parts[i], len);
        p += len;
    }
    *p = '\0';
    return out;
}

char *su_replace_all(const char *s, const char *from, const char *to)
{
    size_t flen = strlen(from), tlen = strlen(to), count = 0;
    if (flen == 0)
        return NULL;
    for (const char *p = s; (p = strstr(p, from)); p += flen)
        count++;
    size_t total = strlen(s) - count * flen + count * tlen + 1;
    char *out = malloc(total);
    if (!out)
        return NULL;
    char *w = out;
    const char *p = s, *hit;
    while ((hit = strstr(p, from))) {
        memcpy(w, p, (size_t)(hit - p));
        w += hit - p;
        memcpy(w, to, tlen);
        w += tlen;
        p = hit + flen;
    }
    strcpy(w, p);
    return out;
}
C
