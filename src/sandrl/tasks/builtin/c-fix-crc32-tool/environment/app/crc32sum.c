/* crc32sum: print the CRC-32 of files. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static uint32_t table[256];

static void make_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
}

static uint32_t crc_stream(FILE *f)
{
    uint32_t crc = 0xFFFFFFFFu;
    char c;
    while ((c = getc(f)) != EOF)
        crc = table[(crc ^ (uint32_t)c) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

int main(int argc, char **argv)
{
    make_table();
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "crc32sum: %s: %s\n", argv[i], strerror(errno));
            continue;
        }
        printf("%08x  %s\n", crc_stream(f), argv[i]);
        fclose(f);
    }
    return 0;
}
