#ifndef INTLIST_H
#define INTLIST_H

#include <stddef.h>

typedef struct node {
    int value;
    struct node *next;
} node;

typedef struct {
    node *head;
    size_t length;
} intlist;

/* An empty list. */
intlist list_new(void);

/* Insert value at the front. Returns 0, or -1 if out of memory. */
int list_push_front(intlist *l, int value);

/* Append value at the end. Returns 0, or -1 if out of memory. */
int list_push_back(intlist *l, int value);

/* Remove every node holding value; returns how many were removed. */
size_t list_remove_all(intlist *l, int value);

/* Reverse the list in place. */
void list_reverse(intlist *l);

/* Copy up to cap values, front to back, into out; returns the list's length. */
size_t list_to_array(const intlist *l, int *out, size_t cap);

/* Free every node; the list is empty afterwards and can be reused. */
void list_clear(intlist *l);

#endif
