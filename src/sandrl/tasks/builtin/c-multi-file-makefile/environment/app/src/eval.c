#include "eval.h"

#include <string.h>

#include "lexer.h"
#include "stack.h"

static int binary(stack *s, char op, const char **error)
{
    long long a, b;
    if (stack_pop(s, &b) || stack_pop(s, &a)) {
        *error = "too few operands";
        return -1;
    }
    long long r;
    switch (op) {
    case '+': r = a + b; break;
    case '-': r = a - b; break;
    case '*': r = a * b; break;
    case '/':
    case '%':
        if (b == 0) {
            *error = "division by zero";
            return -1;
        }
        r = op == '/' ? a / b : a % b;
        break;
    default:
        *error = "unknown operator";
        return -1;
    }
    return stack_push(s, r);
}

int eval_line(const char *line, long long *result, const char **error)
{
    stack s = stack_new();
    const char *cursor = line;
    int rc = 0;
    for (;;) {
        token t = next_token(&cursor);
        if (t.kind == TOK_END)
            break;
        if (t.kind == TOK_NUMBER) {
            rc = stack_push(&s, t.number);
        } else if (strlen(t.word) == 1 && strchr("+-*/%", t.word[0])) {
            rc = binary(&s, t.word[0], error);
        } else if (strcmp(t.word, "dup") == 0) {
            long long top;
            rc = stack_peek(&s, &top);
            if (rc == 0)
                rc = stack_push(&s, top);
            else
                *error = "dup on an empty stack";
        } else if (strcmp(t.word, "swap") == 0) {
            long long a, b;
            if (stack_pop(&s, &b) || stack_pop(&s, &a)) {
                *error = "swap needs two values";
                rc = -1;
            } else {
                stack_push(&s, b);
                rc = stack_push(&s, a);
            }
        } else {
            *error = "unknown token";
            rc = -1;
        }
        if (rc)
            break;
    }
    if (rc == 0 && s.len != 1) {
        *error = s.len ? "more than one value left" : "empty stack";
        rc = -1;
    }
    if (rc == 0)
        *result = s.items[0];
    stack_free(&s);
    return rc;
}
