/* tt_ttds.c: TTDS stream reader (see tt_ttds.h). Portable: fields are decoded byte by byte, so it
 * does not care about the host's endianness or alignment. */
#include "tt_ttds.h"

#include "tt_platform.h"

#define TT_TTDS_HEADER 32u

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

int tt_ttds_open(tt_ttds *s, const char *name) {
    static const uint32_t itemsize[4] = {1, 1, 2, 4};
    uint8_t h[TT_TTDS_HEADER];
    s->fd = tt_open(name, TT_READ);
    if (s->fd < 0) return TT_TTDS_ENOFILE;
    int rc = TT_TTDS_EFORMAT;
    if (tt_read(s->fd, h, sizeof h) != (long)sizeof h) goto fail;
    if (h[0] != 'T' || h[1] != 'T' || h[2] != 'D' || h[3] != 'S' || (h[4] | (h[5] << 8)) != 1) goto fail;
    s->dtype = h[6];
    s->rank = h[7];
    if (s->dtype > 3 || s->rank < 1 || s->rank > 4) goto fail;
    s->count = le32(h + 8);
    uint64_t elems = 1;
    for (int i = 0; i < 4; i++) {
        s->dims[i] = le32(h + 12 + 4 * i);
        if (i < s->rank) elems *= s->dims[i];
    }
    if (elems * itemsize[s->dtype] > 0x7FFFFFFFu) goto fail;
    s->sample_bytes = (uint32_t)elems * itemsize[s->dtype];
    long size = tt_file_size(s->fd);
    if (size < 0 || (uint64_t)size != TT_TTDS_HEADER + (uint64_t)s->count * (4u + s->sample_bytes)) {
        rc = TT_TTDS_ESIZE;
        goto fail;
    }
    s->next = 0;
    return 0;
fail:
    tt_close(s->fd);
    s->fd = -1;
    return rc;
}

int tt_ttds_next(tt_ttds *s, int32_t *label, void *sample) {
    if (s->fd < 0) return TT_TTDS_EIO;
    if (s->next >= s->count) return 0;
    uint8_t l[4];
    if (tt_read(s->fd, l, 4) != 4) return TT_TTDS_EIO;
    if (tt_read(s->fd, sample, s->sample_bytes) != (long)s->sample_bytes) return TT_TTDS_EIO;
    *label = (int32_t)le32(l);
    s->next++;
    return 1;
}

int tt_ttds_seek(tt_ttds *s, uint32_t record) {
    if (s->fd < 0 || record > s->count) return TT_TTDS_EIO;
    uint64_t pos = TT_TTDS_HEADER + (uint64_t)record * (4u + s->sample_bytes);
    if (pos > 0xFFFFFFFFu || tt_seek(s->fd, (uint32_t)pos) != 0) return TT_TTDS_EIO;
    s->next = record;
    return 0;
}

void tt_ttds_close(tt_ttds *s) {
    if (s->fd >= 0) tt_close(s->fd);
    s->fd = -1;
}

const char *tt_ttds_error(int code) {
    switch (code) {
    case TT_TTDS_ENOFILE: return "cannot open the data file";
    case TT_TTDS_EFORMAT: return "not a TTDS v1 data stream";
    case TT_TTDS_ESIZE: return "data file size does not match its header (truncated?)";
    case TT_TTDS_EIO: return "read error in the data file";
    default: return "no error";
    }
}
