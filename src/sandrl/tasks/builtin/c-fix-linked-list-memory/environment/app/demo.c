#include <stdio.h>

#include "intlist.h"

int main(void)
{
    intlist l = list_new();
    int values[] = {3, 1, 3, 3, 7, 3};
    for (size_t i = 0; i < sizeof values / sizeof *values; i++)
        list_push_back(&l, values[i]);
    printf("removed %zu\n", list_remove_all(&l, 3));
    list_reverse(&l);
    int out[8];
    size_t n = list_to_array(&l, out, 8);
    for (size_t i = 0; i < n && i < 8; i++)
        printf("%d ", out[i]);
    printf("(length %zu)\n", l.length);
    list_clear(&l);
    return 0;
}
