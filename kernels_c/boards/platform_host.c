/* platform_host.c: tt_platform.h on the build machine (board `host`), over stdio. Same API and
 * the same formatter as the boards, so host and QEMU runs can be compared byte for byte. */
#include <stdio.h>
#include <stdlib.h>

#include "tt_platform.h"

#ifndef TT_BOARD_NAME
#define TT_BOARD_NAME "host"
#endif

void tt_print_exit_line(int code);

static FILE *files[TT_MAX_FILES];

void tt_console_write(const char *s, size_t n) {
    fwrite(s, 1, n, stdout);
    fflush(stdout); /* keep console order with a crash that follows */
}

int tt_open(const char *name, int mode) {
    const char *m = mode == TT_READ ? "rb" : mode == TT_WRITE ? "wb" : mode == TT_APPEND ? "ab" : NULL;
    if (!m) return -1;
    for (int i = 0; i < TT_MAX_FILES; i++) {
        if (!files[i]) {
            files[i] = fopen(name, m);
            return files[i] ? i : -1;
        }
    }
    return -1;
}

static FILE *file_of(int fd) {
    return fd >= 0 && fd < TT_MAX_FILES ? files[fd] : NULL;
}

long tt_read(int fd, void *buf, size_t n) {
    FILE *f = file_of(fd);
    if (!f) return -1;
    size_t got = fread(buf, 1, n, f);
    return got < n && ferror(f) ? -1 : (long)got;
}

int tt_write(int fd, const void *buf, size_t n) {
    FILE *f = file_of(fd);
    return f && fwrite(buf, 1, n, f) == n ? 0 : -1;
}

int tt_seek(int fd, uint32_t pos) {
    FILE *f = file_of(fd);
    return f && fseek(f, (long)pos, SEEK_SET) == 0 ? 0 : -1;
}

long tt_file_size(int fd) {
    FILE *f = file_of(fd);
    if (!f) return -1;
    long here = ftell(f);
    if (here < 0 || fseek(f, 0, SEEK_END) != 0) return -1;
    long size = ftell(f);
    return fseek(f, here, SEEK_SET) == 0 ? size : -1;
}

int tt_close(int fd) {
    FILE *f = file_of(fd);
    if (!f) return -1;
    files[fd] = NULL;
    return fclose(f) == 0 ? 0 : -1;
}

const char *tt_board(void) {
    return TT_BOARD_NAME;
}

/* No instruction counter and no painted stack on the host: reported as unknown ("-"). */
int tt_have_instructions(void) {
    return 0;
}

uint64_t tt_instructions(void) {
    return 0;
}

uint32_t tt_stack_high_water(void) {
    return 0;
}

uint32_t tt_stack_size(void) {
    return 0;
}

void tt_exit(int code) {
    tt_print_exit_line(code);
    for (int i = 0; i < TT_MAX_FILES; i++) {
        if (files[i]) fclose(files[i]);
    }
    exit(code);
}

int main(void) {
    tt_exit(tt_main());
}
