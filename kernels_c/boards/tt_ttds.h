/* tt_ttds.h: read a TTDS dataset stream (the format of tinytrain/stages/train/data.py, write_stream)
 * one record at a time, so a data set far larger than SRAM streams through a fixed buffer.
 *
 *   header (32 bytes, little-endian): "TTDS", u16 version (1 or 2), u8 dtype (0 int8, 1 uint8,
 *   2 int16, 3 float32), u8 rank R (1..4), u32 N, u32 dims[4], u32 K (version 1: reserved 0;
 *   version 2: float32 targets per record, >= 1)
 *   then N records: i32 label, (version 2) f32 targets[K], then the sample (prod(dims[:R]) elements, C order)
 * Version 2 carries regression targets (MSE training); version 1 files read as before (targets = 0).
 */
#ifndef TT_TTDS_H
#define TT_TTDS_H

#include <stdint.h>

#define TT_TTDS_INT8 0
#define TT_TTDS_UINT8 1
#define TT_TTDS_INT16 2
#define TT_TTDS_FLOAT32 3

/* Error codes (negative) */
#define TT_TTDS_ENOFILE (-1)   /* cannot open */
#define TT_TTDS_EFORMAT (-2)   /* not a TTDS v1/v2 stream / bad header */
#define TT_TTDS_ESIZE (-3)     /* file size does not match N records */
#define TT_TTDS_EIO (-4)       /* read or seek failed, or truncated record */

typedef struct {
    int fd;
    uint8_t dtype;
    uint8_t rank;
    uint32_t count;        /* N */
    uint32_t dims[4];
    uint32_t targets;      /* K float32 targets per record (0 for a version-1 stream) */
    uint32_t sample_bytes; /* bytes of one sample (without the label and targets) */
    uint32_t next;         /* index of the record tt_ttds_next reads */
    uint32_t left;         /* sample bytes of the last record tt_ttds_next_head read not read yet */
} tt_ttds;

int tt_ttds_open(tt_ttds *s, const char *name);                 /* 0, or a negative error code */
int tt_ttds_next(tt_ttds *s, int32_t *label, void *sample);     /* 1 read, 0 at end, negative on error */
/* As tt_ttds_next, also reading the record's K targets into target[0..K) (decoded from little-endian);
 * target may be NULL (the targets are skipped). */
int tt_ttds_next_target(tt_ttds *s, int32_t *label, float *target, void *sample);
/* A record in two parts (a sample taken row by row, as a program that feeds its input asks for it): the label and
 * the targets (target may be NULL), then the sample's bytes in order by tt_ttds_sample_read (0, or TT_TTDS_EIO past
 * the sample's end); the next tt_ttds_next_head skips what was not read. */
int tt_ttds_next_head(tt_ttds *s, int32_t *label, float *target);
int tt_ttds_sample_read(tt_ttds *s, void *dst, uint32_t bytes);
int tt_ttds_seek(tt_ttds *s, uint32_t record);                  /* 0, or negative */
void tt_ttds_close(tt_ttds *s);
const char *tt_ttds_error(int code);

#endif /* TT_TTDS_H */
