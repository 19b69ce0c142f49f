/* platform_semihost.c: tt_platform.h on Cortex-M boards, over ARM semihosting. QEMU serves the
 * calls from its own working directory, which emulate-run makes the run folder. */
#include "semihost.h"
#include "tt_platform.h"

#ifndef TT_BOARD_NAME
#define TT_BOARD_NAME "unknown-board"
#endif

void tt_print_exit_line(int code);

static int32_t console_fd = -1;

void tt_console_write(const char *s, size_t n) {
    /* ":tt" is the semihosting name of the console; writing to it by handle takes a length, so
     * the text need not be NUL-terminated. */
    if (console_fd < 0) console_fd = sh_open(":tt", 4 /* "w" */);
    if (console_fd >= 0) sh_write(console_fd, s, (uint32_t)n);
}

int tt_open(const char *name, int mode) {
    int32_t sh_mode = mode == TT_READ ? SH_MODE_RB : mode == TT_WRITE ? SH_MODE_WB : mode == TT_APPEND ? SH_MODE_AB : -1;
    if (sh_mode < 0) return -1;
    int32_t fd = sh_open(name, sh_mode);
    return fd < 0 ? -1 : (int)fd;
}

long tt_read(int fd, void *buf, size_t n) {
    int32_t left = sh_read(fd, buf, (uint32_t)n);
    if (left < 0 || (uint32_t)left > n) return -1;
    return (long)(n - (uint32_t)left);
}

int tt_write(int fd, const void *buf, size_t n) {
    return sh_write(fd, buf, (uint32_t)n) == 0 ? 0 : -1;
}

int tt_seek(int fd, uint32_t pos) {
    return sh_seek(fd, pos) == 0 ? 0 : -1;
}

long tt_file_size(int fd) {
    int32_t n = sh_flen(fd);
    return n < 0 ? -1 : (long)n;
}

int tt_close(int fd) {
    return sh_close(fd) == 0 ? 0 : -1;
}

const char *tt_board(void) {
    return TT_BOARD_NAME;
}

void tt_exit(int code) {
    tt_print_exit_line(code);
    sh_exit(code);
}
