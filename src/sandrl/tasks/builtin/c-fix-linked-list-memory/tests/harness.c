/* Reads operations from stdin, prints the list after each one. */
#include <stdio.h>
#include <stdlib.h>

#include "intlist.h"

int main(void)
{
    intlist l = list_new();
    char op;
    int v;
    int out[4096];
    while (scanf(" %c", &op) == 1) {
        switch (op) {
        case 'f': if (scanf("%d", &v) != 1) return 2; list_push_front(&l, v); break;
        case 'b': if (scanf("%d", &v) != 1) return 2; list_push_back(&l, v); break;
        case 'r': if (scanf("%d", &v) != 1) return 2; printf("removed %zu\n", list_remove_all(&l, v)); break;
        case 'v': list_reverse(&l); break;
        case 'c': list_clear(&l); break;
        case 's': {
            size_t cap = 3;
            int small[3] = {0, 0, 0};
            size_t n = list_to_array(&l, small, cap);
            printf("small %zu:", n);
            for (size_t i = 0; i < n && i < cap; i++) printf(" %d", small[i]);
            printf("\n");
            break;
        }
        default: return 3;
        }
        size_t n = list_to_array(&l, out, 4096);
        printf("len %zu/%zu:", l.length, n);
        for (size_t i = 0; i < n && i < 4096; i++) printf(" %d", out[i]);
        printf("\n");
    }
    list_clear(&l);
    return 0;
}
