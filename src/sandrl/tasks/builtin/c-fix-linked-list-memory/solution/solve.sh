#!/bin/bash
# Oracle: count the first push_back, unlink before free, respect cap, save next before free, and
# reset the length on clear.
set -euo pipefail
cat > /workspace/intlist.c <<'C'
#include "intlist.h"

#include <stdlib.h>

intlist list_new(void)
{
    intlist l = {NULL, 0};
    return l;
}

int list_push_front(intlist *l, int value)
{
    node *n = malloc(sizeof *n);
    if (!n)
        return -1;
    n->value = value;
    n->next = l->head;
    l->head = n;
    l->length++;
    return 0;
}

int list_push_back(intlist *l, int value)
{
    node *n = malloc(sizeof *n);
    if (!n)
        return -1;
    n->value = value;
    n->next = NULL;
    node **link = &l->head;
    while (*link)
        link = &(*link)->next;
    *link = n;
    l->length++;
    return 0;
}

size_t list_remove_all(intlist *l, int value)
{
    size_t removed = 0;
    node **link = &l->head;
    while (*link) {
        node *cur = *link;
        if (cur->value == value) {
            *link = cur->next;
            free(cur);
            removed++;
        } else {
            link = &cur->next;
        }
    }
    l->length -= removed;
    return removed;
}

void list_reverse(intlist *l)
{
    node *prev = NULL, *cur = l->head;
    while (cur) {
        node *next = cur->next;
        cur->next = prev;
        prev = cur;
        cur = next;
    }
    l->head = prev;
}

size_t list_to_array(const intlist *l, int *out, size_t cap)
{
    size_t i = 0;
    for (const node *p = l->head; p; p = p->next) {
        if (i < cap)
            out[i] = p->value;
        i++;
    }
    return i;
}

void list_clear(intlist *l)
{
    node *p = l->head;
    while (p) {
        node *next = p->next;
        free(p);
        p = next;
    }
    l->head = NULL;
    l->length = 0;
}
C
