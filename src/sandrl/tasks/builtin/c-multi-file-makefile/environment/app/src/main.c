#include <stdio.h>
#include <string.h>

#include "eval.h"

int main(void)
{
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        if (strspn(line, " \t\r\n") == strlen(line))
            continue;
        long long result;
        const char *error = "unknown error";
        if (eval_line(line, &result, &error) == 0)
            printf("%lld\n", result);
        else
            printf("error: %s\n", error);
    }
    return 0;
}
