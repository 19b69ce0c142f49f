/* tt_common.c: the platform-independent half of tt_platform.h, compiled for every board.
 *
 * Our own small printf: newlib-nano's cannot print 64-bit integers and pulls in several KB of
 * stdio, and one formatter everywhere makes the console of host and QEMU identical byte for byte.
 */
#include <stdarg.h>
#include <string.h>

#include "tt_platform.h"

/* ---- formatter -------------------------------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t cap;
    size_t len; /* characters the full output needs (as snprintf returns) */
} tt_out;

static void out_char(tt_out *o, char c) {
    if (o->len + 1 < o->cap) o->buf[o->len] = c;
    o->len++;
}

static void out_uint(tt_out *o, uint64_t v, unsigned base, int upper, int width, char pad, int neg) {
    char tmp[24];
    const char *digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    int n = 0;
    do {
        tmp[n++] = digits[v % base];
        v /= base;
    } while (v != 0);
    int total = n + (neg ? 1 : 0);
    if (neg && pad == '0') out_char(o, '-');
    for (; total < width; total++) out_char(o, pad);
    if (neg && pad != '0') out_char(o, '-');
    while (n > 0) out_char(o, tmp[--n]);
}

static int tt_vformat(char *buf, size_t cap, const char *fmt, va_list ap) {
    tt_out o = {buf, cap, 0};
    for (const char *p = fmt; *p; p++) {
        if (*p != '%') {
            out_char(&o, *p);
            continue;
        }
        p++;
        char pad = ' ';
        int width = 0, lng = 0;
        if (*p == '0') {
            pad = '0';
            p++;
        }
        while (*p >= '0' && *p <= '9') width = width * 10 + (*p++ - '0');
        while (*p == 'l') {
            lng++;
            p++;
        }
        switch (*p) {
        case 'd':
        case 'i': {
            int64_t v = lng >= 2 ? va_arg(ap, long long) : lng == 1 ? va_arg(ap, long) : va_arg(ap, int);
            uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
            out_uint(&o, mag, 10, 0, width, pad, v < 0);
            break;
        }
        case 'u':
        case 'x':
        case 'X': {
            uint64_t v = lng >= 2 ? va_arg(ap, unsigned long long)
                         : lng == 1 ? va_arg(ap, unsigned long) : va_arg(ap, unsigned int);
            out_uint(&o, v, *p == 'u' ? 10u : 16u, *p == 'X', width, pad, 0);
            break;
        }
        case 'c':
            out_char(&o, (char)va_arg(ap, int));
            break;
        case 's': {
            const char *s = va_arg(ap, const char *);
            if (!s) s = "(null)";
            int n = (int)strlen(s);
            for (; n < width; n++) out_char(&o, ' ');
            while (*s) out_char(&o, *s++);
            break;
        }
        case '%':
            out_char(&o, '%');
            break;
        case '\0':
            p--; /* a lone '%' at the end: stop */
            break;
        default: /* unsupported conversion: show it, never read an argument for it */
            out_char(&o, '%');
            out_char(&o, *p);
            break;
        }
    }
    if (cap > 0) buf[o.len < cap ? o.len : cap - 1] = '\0';
    return (int)o.len;
}

int tt_snprintf(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = tt_vformat(buf, cap, fmt, ap);
    va_end(ap);
    return n;
}

void tt_log(const char *fmt, ...) {
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = tt_vformat(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t len = n < (int)sizeof line ? (size_t)n : sizeof line - 1;
    tt_console_write(line, len);
}

void tt_progress(uint32_t done, uint32_t total, const char *what) {
    tt_log("@tt progress %lu/%lu %s\n", (unsigned long)done, (unsigned long)total, what ? what : "");
}

uint32_t tt_f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u); /* the defined way to reinterpret bits in C99 */
    return u;
}

/* ---- whole files ------------------------------------------------------------------------------ */

long tt_read_file(const char *name, void *buf, size_t cap) {
    int fd = tt_open(name, TT_READ);
    if (fd < 0) return -1;
    long size = tt_file_size(fd);
    if (size < 0) {
        tt_close(fd);
        return -1;
    }
    if ((unsigned long)size > cap) {
        tt_close(fd);
        return -2;
    }
    long got = tt_read(fd, buf, (size_t)size);
    tt_close(fd);
    return got == size ? size : -1;
}

int tt_write_file(const char *name, const void *buf, size_t n) {
    int fd = tt_open(name, TT_WRITE);
    if (fd < 0) return -1;
    int rc = tt_write(fd, buf, n);
    if (tt_close(fd) != 0) rc = -1;
    return rc;
}

/* ---- ending ----------------------------------------------------------------------------------- */

/* The line emulate-run parses; printed by every platform's tt_exit. */
void tt_print_exit_line(int code);
void tt_print_exit_line(int code) {
    char ins[24] = "-", hw[16] = "-", ss[16] = "-";
    if (tt_have_instructions()) tt_snprintf(ins, sizeof ins, "%llu", (unsigned long long)tt_instructions());
    if (tt_stack_size() != 0) {
        tt_snprintf(hw, sizeof hw, "%lu", (unsigned long)tt_stack_high_water());
        tt_snprintf(ss, sizeof ss, "%lu", (unsigned long)tt_stack_size());
    }
    tt_log("@tt exit code=%d instructions=%s stack_high_water=%s stack_size=%s\n", code, ins, hw, ss);
}

void tt_fail(const char *msg) {
    tt_log("@tt fail %s\n", msg ? msg : "");
    tt_exit(TT_EXIT_FAILED);
}
