/* semihost.h: ARM semihosting (the debugger, here QEMU, services `bkpt 0xAB` with r0 = operation,
 * r1 = pointer to the arguments). Operation numbers from Arm's "Semihosting for AArch32 and
 * AArch64" specification. Only Cortex-M boards compile this; tt_platform.h is what programs use.
 */
#ifndef TT_SEMIHOST_H
#define TT_SEMIHOST_H

#include <stddef.h>
#include <stdint.h>

#define SH_SYS_OPEN 0x01
#define SH_SYS_CLOSE 0x02
#define SH_SYS_WRITE0 0x04
#define SH_SYS_WRITE 0x05
#define SH_SYS_READ 0x06
#define SH_SYS_SEEK 0x0A
#define SH_SYS_FLEN 0x0C
#define SH_SYS_EXIT 0x18
#define SH_SYS_EXIT_EXTENDED 0x20

#define SH_ADP_STOPPED_APPLICATION_EXIT 0x20026
#define SH_ADP_STOPPED_INTERNAL_ERROR 0x20024

/* SYS_OPEN modes (ISO C fopen modes by index). */
#define SH_MODE_RB 1
#define SH_MODE_WB 5
#define SH_MODE_AB 9

int32_t sh_call(int32_t op, void *args);
int32_t sh_open(const char *name, int32_t mode);            /* handle, or -1 */
int32_t sh_close(int32_t fd);                               /* 0 ok, -1 */
int32_t sh_write(int32_t fd, const void *buf, uint32_t n);  /* bytes NOT written (0 = all) */
int32_t sh_read(int32_t fd, void *buf, uint32_t n);         /* bytes NOT read (n = end of file) */
int32_t sh_seek(int32_t fd, uint32_t pos);                  /* 0 ok, negative on error */
int32_t sh_flen(int32_t fd);                                /* length, or -1 */
void sh_write0(const char *s);                              /* NUL-terminated string to the console */
void sh_exit(int32_t code) __attribute__((noreturn));

#endif /* TT_SEMIHOST_H */
