#!/bin/bash
# Oracle: let gcc write dependency files (-MMD -MP) next to the objects and include them.
set -euo pipefail
cat > /workspace/Makefile <<'MK'
CC = gcc
CFLAGS = -std=c11 -Wall -Wextra -O2 -Iinclude
DEPFLAGS = -MMD -MP
SRCS = $(wildcard src/*.c)
OBJS = $(SRCS:src/%.c=build/%.o)
DEPS = $(OBJS:.o=.d)

all: bin/app

bin/app: $(OBJS)
	@mkdir -p bin
	$(CC) $(CFLAGS) -o $@ $(OBJS)

build/%.o: src/%.c
	@mkdir -p build
	$(CC) $(CFLAGS) $(DEPFLAGS) -c -o $@ $<

clean:
	rm -rf build bin

.PHONY: all clean

-include $(DEPS)
MK
