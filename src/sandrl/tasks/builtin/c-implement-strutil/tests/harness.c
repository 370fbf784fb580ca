/* Reads tab-separated operations, one per line, and prints each result in brackets. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strutil.h"

#define MAXF 64

int main(void)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, stdin)) > 0) {
        if (line[len - 1] == '\n')
            line[--len] = '\0';
        char *fields[MAXF];
        size_t nf = 0;
        char *p = line;
        fields[nf++] = p;
        while ((p = strchr(p, '\t')) && nf < MAXF) {
            *p++ = '\0';
            fields[nf++] = p;
        }
        const char *op = fields[0];
        if (strcmp(op, "trim") == 0 && nf == 2) {
            char *copy = strdup(fields[1]);
            char *r = su_trim(copy);
            if (!r || r < copy || r > copy + strlen(fields[1]))
                printf("BAD-POINTER\n");
            else
                printf("[%s]\n", r);
            free(copy);
        } else if (strcmp(op, "count") == 0 && nf == 2) {
            printf("[%zu]\n", su_count_words(fields[1]));
        } else if (strcmp(op, "join") == 0 && nf >= 2) {
            char *r = su_join((const char *const *)(fields + 2), nf - 2, fields[1]);
            printf("[%s]\n", r ? r : "(null)");
            free(r);
        } else if (strcmp(op, "replace") == 0 && nf == 4) {
            char *r = su_replace_all(fields[1], fields[2], fields[3]);
            printf("[%s]\n", r ? r : "(null)");
            free(r);
        } else {
            printf("BAD-OP\n");
        }
    }
    free(line);
    return 0;
}
