#include "stack.h"

#include <stdlib.h>

stack stack_new(void)
{
    stack s = {NULL, 0, 0};
    return s;
}

int stack_push(stack *s, long long v)
{
    if (s->len == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        long long *items = realloc(s->items, cap * sizeof *items);
        if (!items)
            return -1;
        s->items = items;
        s->cap = cap;
    }
    s->items[s->len++] = v;
    return 0;
}

int stack_pop(stack *s, long long *out)
{
    if (s->len == 0)
        return -1;
    *out = s->items[--s->len];
    return 0;
}

void stack_free(stack *s)
{
    free(s->items);
    s->items = NULL;
    s->len = s->cap = 0;
}
