#ifndef STRUTIL_H
#define STRUTIL_H

#include <stddef.h>

/* Trim s in place: write a '\0' after its last non-whitespace character and return a pointer
 * to its first non-whitespace character (inside s). An all-whitespace s yields "". */
char *su_trim(char *s);

/* The number of words in s: maximal runs of non-whitespace characters. */
size_t su_count_words(const char *s);

/* A new string (malloc'd; the caller frees it): parts[0..n-1] joined with sep between them.
 * n == 0 gives "". NULL only when out of memory. */
char *su_join(const char *const *parts, size_t n, const char *sep);

/* A new string (malloc'd; the caller frees it): s with every occurrence of from replaced by to,
 * scanning left to right without overlaps ("aaa", "aa", "b" gives "ba"). An empty from returns
 * NULL; otherwise NULL only when out of memory. */
char *su_replace_all(const char *s, const char *from, const char *to);

#endif
