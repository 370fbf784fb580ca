#!/bin/bash
# Oracle: a tab-indented recipe, -Iinclude, lexer.o in the link, and the missing stack_peek.
set -euo pipefail
cd /workspace
cat > Makefile <<'MK'
CC = gcc
CFLAGS = -std=c11 -Wall -Wextra -Werror -O2 -Iinclude
SRCS = $(wildcard src/*.c)
OBJS = $(patsubst src/%.c,build/%.o,$(SRCS))

all: bin/rpn

bin/rpn: $(OBJS)
	@mkdir -p bin
	$(CC) $(CFLAGS) -o $@ $(OBJS)

build/%.o: src/%.c $(wildcard include/*.h)
	@mkdir -p build
	$(CC) $(CFLAGS) -c -o $@ $<

clean:
	rm -rf build bin

.PHONY: all clean
MK
cat >> src/stack.c <<'C'

int stack_peek(const stack *s, long long *out)
{
    if (s->len == 0)
        return -1;
    *out = s->items[s->len - 1];
    return 0;
}
C
make -s
