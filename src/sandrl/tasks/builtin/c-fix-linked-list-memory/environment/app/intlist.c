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
    if (!l->head) {
        l->head = n;
        return 0;
    }
    node *p = l->head;
    while (p->next)
        p = p->next;
    p->next = n;
    l->length++;
    return 0;
}

size_t list_remove_all(intlist *l, int value)
{
    size_t removed = 0;
    while (l->head && l->head->value == value) {
        node *dead = l->head;
        l->head = dead->next;
        free(dead);
        removed++;
    }
    for (node *p = l->head; p && p->next; p = p->next) {
        if (p->next->value == value) {
            free(p->next);
            p->next = p->next->next;
            removed++;
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
    for (node *p = l->head; p; p = p->next) {
        if (i <= cap)
            out[i] = p->value;
        i++;
    }
    return i;
}

void list_clear(intlist *l)
{
    for (node *p = l->head; p; p = p->next)
        free(p);
    l->head = NULL;
}
