#ifndef STACK_H
#define STACK_H

#include <stddef.h>

typedef struct {
    long long *items;
    size_t len;
    size_t cap;
} stack;

/* An empty stack. */
stack stack_new(void);

/* Push v; 0 on success, -1 when out of memory. */
int stack_push(stack *s, long long v);

/* Pop the top into *out; 0 on success, -1 when the stack is empty. */
int stack_pop(stack *s, long long *out);

/* Copy the top into *out without removing it; 0 on success, -1 when empty. */
int stack_peek(const stack *s, long long *out);

void stack_free(stack *s);

#endif
