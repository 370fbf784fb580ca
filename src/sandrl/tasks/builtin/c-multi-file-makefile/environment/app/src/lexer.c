#include "lexer.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

token next_token(const char **cursor)
{
    token t;
    const char *p = *cursor;
    memset(&t, 0, sizeof t);
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    if (*p == '\0') {
        t.kind = TOK_END;
        *cursor = p;
        return t;
    }
    const char *start = p;
    while (*p && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
        p++;
    size_t len = (size_t)(p - start);
    const char *digits = start + (*start == '-' && len > 1);
    int numeric = digits < p;
    for (const char *q = digits; q < p; q++)
        if (!isdigit((unsigned char)*q))
            numeric = 0;
    if (numeric) {
        t.kind = TOK_NUMBER;
        t.number = strtoll(start, NULL, 10);
    } else {
        t.kind = TOK_WORD;
        size_t n = len < sizeof t.word - 1 ? len : sizeof t.word - 1;
        memcpy(t.word, start, n);
        t.word[n] = '\0';
        if (len >= sizeof t.word)
            t.word[0] = '?'; /* too long: never a valid word */
    }
    *cursor = p;
    return t;
}
