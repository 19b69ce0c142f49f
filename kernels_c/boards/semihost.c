/* semihost.c: the semihosting calls behind tt_platform on Cortex-M boards. */
#include "semihost.h"

int32_t sh_call(int32_t op, void *args) {
    /* The operation and argument block must be in r0/r1 exactly when bkpt executes; the host
     * writes the result into r0 and may read or write the block (hence the memory clobber). */
    register int32_t r0 __asm__("r0") = op;
    register void *r1 __asm__("r1") = args;
    __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

static uint32_t sh_strlen(const char *s) {
    uint32_t n = 0;
    while (s[n]) n++;
    return n;
}

int32_t sh_open(const char *name, int32_t mode) {
    uint32_t args[3] = {(uint32_t)(uintptr_t)name, (uint32_t)mode, sh_strlen(name)};
    return sh_call(SH_SYS_OPEN, args);
}

int32_t sh_close(int32_t fd) {
    uint32_t args[1] = {(uint32_t)fd};
    return sh_call(SH_SYS_CLOSE, args);
}

int32_t sh_write(int32_t fd, const void *buf, uint32_t n) {
    uint32_t args[3] = {(uint32_t)fd, (uint32_t)(uintptr_t)buf, n};
    return sh_call(SH_SYS_WRITE, args);
}

int32_t sh_read(int32_t fd, void *buf, uint32_t n) {
    uint32_t args[3] = {(uint32_t)fd, (uint32_t)(uintptr_t)buf, n};
    return sh_call(SH_SYS_READ, args);
}

int32_t sh_seek(int32_t fd, uint32_t pos) {
    uint32_t args[2] = {(uint32_t)fd, pos};
    return sh_call(SH_SYS_SEEK, args);
}

int32_t sh_flen(int32_t fd) {
    uint32_t args[1] = {(uint32_t)fd};
    return sh_call(SH_SYS_FLEN, args);
}

void sh_write0(const char *s) {
    sh_call(SH_SYS_WRITE0, (void *)(uintptr_t)s);
}

void sh_exit(int32_t code) {
    /* SYS_EXIT_EXTENDED carries the exit status on AArch32 (QEMU exits with it). An older host
     * that lacks it returns; then plain SYS_EXIT can only say success or failure. */
    uint32_t args[2] = {SH_ADP_STOPPED_APPLICATION_EXIT, (uint32_t)code};
    sh_call(SH_SYS_EXIT_EXTENDED, args);
    sh_call(SH_SYS_EXIT, (void *)(uintptr_t)(code == 0 ? SH_ADP_STOPPED_APPLICATION_EXIT
                                                        : SH_ADP_STOPPED_INTERNAL_ERROR));
    for (;;) {
    }
}
