"""Generate the hash-mixing table: table.h, table_index.c and table_<k>.c (k < PARTS).

Usage: python3 gen_table.py OUTDIR
"""

import sys
from pathlib import Path

NFUNCS = 2400
PARTS = 4
MASK = (1 << 64) - 1


def constants():
    state = 12345
    for _ in range(NFUNCS):
        out = []
        for _ in range(4):
            state = (state * 6364136223846793005 + 1442695040888963407) & MASK
            out.append(state >> 33)
        a, b, s, k = out
        yield a | 1, b, s % 13 + 3, k % 8 + 4


def main(outdir):
    out = Path(outdir)
    funcs = list(constants())
    header = [
        "#ifndef TABLE_H",
        "#define TABLE_H",
        "#include <stdint.h>",
        f"#define NFUNCS {NFUNCS}",
        "typedef uint64_t (*mix_fn)(uint64_t);",
        "extern const mix_fn TABLE[NFUNCS];",
    ]
    header += [f"uint64_t mix_{i}(uint64_t x);" for i in range(NFUNCS)]
    (out / "table.h").write_text("\n".join(header + ["#endif", ""]))
    per_part = (NFUNCS + PARTS - 1) // PARTS
    for part in range(PARTS):
        lines = ['#include "table.h"', ""]
        for i in range(part * per_part, min(NFUNCS, (part + 1) * per_part)):
            a, b, s, k = funcs[i]
            lines += [
                f"uint64_t mix_{i}(uint64_t x)",
                "{",
                f"    uint64_t acc = {b}u;",
                f"    for (unsigned j = 0; j < {k}u; j++) {{",
                f"        acc = acc * {a}u + (x ^ j);",
                f"        acc ^= acc >> {s};",
                "    }",
                "    return acc;",
                "}",
                "",
            ]
        (out / f"table_{part}.c").write_text("\n".join(lines))
    index = ['#include "table.h"', "", "const mix_fn TABLE[NFUNCS] = {"]
    index += [f"    mix_{i}," for i in range(NFUNCS)]
    (out / "table_index.c").write_text("\n".join(index + ["};", ""]))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
