#ifndef EVAL_H
#define EVAL_H

/* Evaluate one RPN line. 0 and *result on success; -1 and *error (a static message) otherwise. */
int eval_line(const char *line, long long *result, const char **error);

#endif
