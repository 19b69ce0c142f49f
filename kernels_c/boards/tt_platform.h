/* tt_platform.h: the only interface between a tinytrain program and the board it runs on.
 *
 * The generated training program (and any test program) is written against this API alone, so
 * the same C compiles for `host` (stdio, native cc) and for every Cortex-M board (ARM
 * semihosting inside QEMU). Portable C99; no malloc anywhere.
 *
 * Entry point: the program defines `int tt_main(void)`, not `main`. Each platform owns `main` /
 * `Reset_Handler`, runs its set-up (FPU on, stack painted, instruction counter started) and ends
 * with tt_exit(tt_main()), so the exit line below is printed on every board the same way.
 *
 * Files are named relative to the run folder that emulate-run prepares (QEMU's working
 * directory, or the native process's). Everything a program wants to hand back (results.json,
 * trained weights) it writes there with tt_write_file / tt_open(TT_WRITE).
 */
#ifndef TT_PLATFORM_H
#define TT_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TT_NORETURN __attribute__((noreturn))
#define TT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define TT_NORETURN
#define TT_PRINTF(f, a)
#endif

/* Exit codes. 0..99 belong to the program; the platform uses the rest. */
#define TT_EXIT_OK 0
#define TT_EXIT_FAILED 1           /* the program found an error (tt_fail) */
#define TT_EXIT_FAULT_BASE 100     /* a CPU fault: 100 + exception number (103 HardFault, 104
                                      MemManage, 105 BusFault, 106 UsageFault, 102 NMI) */
#define TT_EXIT_UNEXPECTED_IRQ 127 /* an interrupt nobody enabled fired */

/* The program's entry point (defined by the program). Its return value is the exit code. */
int tt_main(void);

/* ---- console ---------------------------------------------------------------------------------
 * printf subset, identical on every platform (one formatter, tt_common.c): %d %i %u %x %X %c %s %%
 * with the length modifiers l and ll, a width and the 0 flag. No floating point: print a float's
 * bits with tt_f32_bits() ("%08lx") so that results compare bit for bit. Lines longer than 255
 * characters are cut. */
void tt_log(const char *fmt, ...) TT_PRINTF(1, 2);
int tt_snprintf(char *buf, size_t cap, const char *fmt, ...) TT_PRINTF(3, 4);
/* Progress for long runs: prints "@tt progress <done>/<total> <what>", which emulate-run shows. */
void tt_progress(uint32_t done, uint32_t total, const char *what);

/* ---- files ----------------------------------------------------------------------------------- */
#define TT_READ 0   /* binary read */
#define TT_WRITE 1  /* binary write: create or truncate */
#define TT_APPEND 2 /* binary append */
#define TT_MAX_FILES 8

int tt_open(const char *name, int mode);                 /* handle >= 0, or -1 */
long tt_read(int fd, void *buf, size_t n);               /* bytes read (< n only at end of file), -1 error */
int tt_write(int fd, const void *buf, size_t n);         /* 0 when all n bytes were written, -1 otherwise */
int tt_seek(int fd, uint32_t pos);                       /* absolute position; 0 ok, -1 error */
long tt_file_size(int fd);                               /* bytes, or -1 */
int tt_close(int fd);                                    /* 0 ok, -1 error */
/* Whole files: size read (<= cap), -1 when it cannot be opened, -2 when it is larger than cap. */
long tt_read_file(const char *name, void *buf, size_t cap);
int tt_write_file(const char *name, const void *buf, size_t n); /* 0 ok, -1 error */

/* ---- ending ------------------------------------------------------------------------------------
 * tt_exit prints "@tt exit code=<c> instructions=<n|-> stack_high_water=<b|-> stack_size=<b|->"
 * (emulate-run parses it) and stops the program (QEMU exits with that code). */
TT_NORETURN void tt_exit(int code);
TT_NORETURN void tt_fail(const char *msg); /* logs "@tt fail <msg>", exits with TT_EXIT_FAILED */

/* ---- measurement ------------------------------------------------------------------------------ */
/* Instructions executed since start-up. Boards: QEMU runs with -icount shift=0 (one instruction =
 * 1 ns of virtual time) and SysTick counts the 25 MHz system clock, so the count is exact to 40
 * instructions and deterministic run to run. Host: 0 (tt_have_instructions() says so). */
uint64_t tt_instructions(void);
int tt_have_instructions(void);
/* Deepest stack use since start-up, in bytes (the stack is painted at reset); 0 on host. */
uint32_t tt_stack_high_water(void);
uint32_t tt_stack_size(void); /* the stack reserved by the linker script; 0 on host */
const char *tt_board(void);    /* the board name the firmware was built for */

/* The bits of a float, for printing results exactly. */
uint32_t tt_f32_bits(float x);

/* Platform-private: write n console bytes (tt_common.c calls it). */
void tt_console_write(const char *s, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* TT_PLATFORM_H */
