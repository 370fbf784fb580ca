#!/bin/bash
# Oracle: run python3, make the generator one grouped-target rule (GNU make 4.3 `&:`), and
# make every object depend on the generated header.
set -euo pipefail
cat > /workspace/Makefile <<'MK'
CC = gcc
CFLAGS = -std=c11 -Wall -O2
GEN = table.h table_index.c table_0.c table_1.c table_2.c table_3.c
OBJS = main.o table_index.o table_0.o table_1.o table_2.o table_3.o

lookup: $(OBJS)
	$(CC) $(CFLAGS) -o $@ $(OBJS)

$(GEN) &: gen_table.py
	python3 gen_table.py .

$(OBJS): table.h

%.o: %.c
	$(CC) $(CFLAGS) -c -o $@ $<

clean:
	rm -f lookup *.o $(GEN)

.PHONY: clean
MK
