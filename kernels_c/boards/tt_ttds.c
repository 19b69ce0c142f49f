/* tt_ttds.c: TTDS stream reader (see tt_ttds.h). Portable: fields are decoded byte by byte, so it
 * does not care about the host's endianness or alignment. */
#include "tt_ttds.h"

#include "tt_platform.h"

#include <string.h>

#define TT_TTDS_HEADER 32u

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Bytes of one record: label, targets, sample. */
static uint64_t tt_ttds_record(const tt_ttds *s) {
    return 4u + 4u * (uint64_t)s->targets + s->sample_bytes;
}

int tt_ttds_open(tt_ttds *s, const char *name) {
    static const uint32_t itemsize[4] = {1, 1, 2, 4};
    uint8_t h[TT_TTDS_HEADER];
    s->fd = tt_open(name, TT_READ);
    if (s->fd < 0) return TT_TTDS_ENOFILE;
    int rc = TT_TTDS_EFORMAT;
    if (tt_read(s->fd, h, sizeof h) != (long)sizeof h) goto fail;
    const unsigned version = (unsigned)h[4] | ((unsigned)h[5] << 8);
    if (h[0] != 'T' || h[1] != 'T' || h[2] != 'D' || h[3] != 'S' || (version != 1u && version != 2u)) goto fail;
    s->dtype = h[6];
    s->rank = h[7];
    s->targets = le32(h + 28);
    if (s->dtype > 3 || s->rank < 1 || s->rank > 4) goto fail;
    /* Version 2 exactly when there are targets; a bound on K keeps the record size from overflowing. */
    if ((version == 2u) != (s->targets != 0u) || s->targets > 0x1000000u) goto fail;
    s->count = le32(h + 8);
    uint64_t elems = 1;
    for (int i = 0; i < 4; i++) {
        s->dims[i] = le32(h + 12 + 4 * i);
        if (i < s->rank) elems *= s->dims[i];
    }
    if (elems * itemsize[s->dtype] > 0x7FFFFFFFu) goto fail;
    s->sample_bytes = (uint32_t)elems * itemsize[s->dtype];
    long size = tt_file_size(s->fd);
    if (size < 0 || (uint64_t)size != TT_TTDS_HEADER + (uint64_t)s->count * tt_ttds_record(s)) {
        rc = TT_TTDS_ESIZE;
        goto fail;
    }
    s->next = 0;
    s->left = 0;
    return 0;
fail:
    tt_close(s->fd);
    s->fd = -1;
    return rc;
}

int tt_ttds_next(tt_ttds *s, int32_t *label, void *sample) {
    return tt_ttds_next_target(s, label, (float *)0, sample);
}

int tt_ttds_next_target(tt_ttds *s, int32_t *label, float *target, void *sample) {
    const int rc = tt_ttds_next_head(s, label, target);
    if (rc != 1) return rc;
    return tt_ttds_sample_read(s, sample, s->sample_bytes) == 0 ? 1 : TT_TTDS_EIO;
}

int tt_ttds_sample_read(tt_ttds *s, void *dst, uint32_t bytes) {
    if (s->fd < 0 || bytes > s->left) return TT_TTDS_EIO;
    if (tt_read(s->fd, dst, bytes) != (long)bytes) return TT_TTDS_EIO;
    s->left -= bytes;
    return 0;
}

int tt_ttds_next_head(tt_ttds *s, int32_t *label, float *target) {
    if (s->fd < 0) return TT_TTDS_EIO;
    if (s->next >= s->count) return 0;
    if (s->left != 0u) {
        /* the previous sample was not read to its end: go to this record */
        const uint64_t at = TT_TTDS_HEADER + (uint64_t)s->next * tt_ttds_record(s);
        if (at > 0xFFFFFFFFu || tt_seek(s->fd, (uint32_t)at) != 0) return TT_TTDS_EIO;
        s->left = 0;
    }
    uint8_t l[4];
    if (tt_read(s->fd, l, 4) != 4) return TT_TTDS_EIO;
    if (s->targets != 0u) {
        if (target != (float *)0) {
            /* Read the raw bytes into the caller's floats, then decode each in place: 4 bytes in, 4 bytes out at
             * the same address, so it is independent of the host's byte order. */
            uint8_t *raw = (uint8_t *)target;
            uint32_t k;
            if (tt_read(s->fd, raw, 4u * s->targets) != (long)(4u * s->targets)) return TT_TTDS_EIO;
            for (k = 0; k < s->targets; k++) {
                const uint32_t u = le32(raw + 4u * k);
                memcpy(&target[k], &u, 4);
            }
        } else {
            /* Skip the targets: seek to the sample of this record. */
            const uint64_t pos = TT_TTDS_HEADER + (uint64_t)s->next * tt_ttds_record(s) + 4u + 4u * (uint64_t)s->targets;
            if (pos > 0xFFFFFFFFu || tt_seek(s->fd, (uint32_t)pos) != 0) return TT_TTDS_EIO;
        }
    }
    *label = (int32_t)le32(l);
    s->left = s->sample_bytes;
    s->next++;
    return 1;
}

int tt_ttds_seek(tt_ttds *s, uint32_t record) {
    if (s->fd < 0 || record > s->count) return TT_TTDS_EIO;
    uint64_t pos = TT_TTDS_HEADER + (uint64_t)record * tt_ttds_record(s);
    if (pos > 0xFFFFFFFFu || tt_seek(s->fd, (uint32_t)pos) != 0) return TT_TTDS_EIO;
    s->next = record;
    s->left = 0;
    return 0;
}

void tt_ttds_close(tt_ttds *s) {
    if (s->fd >= 0) tt_close(s->fd);
    s->fd = -1;
}

const char *tt_ttds_error(int code) {
    switch (code) {
    case TT_TTDS_ENOFILE: return "cannot open the data file";
    case TT_TTDS_EFORMAT: return "not a TTDS v1/v2 data stream";
    case TT_TTDS_ESIZE: return "data file size does not match its header (truncated?)";
    case TT_TTDS_EIO: return "read error in the data file";
    default: return "no error";
    }
}
