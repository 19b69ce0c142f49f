"""The embeddable C API of a generated model (issue 12): `tt_model.h` and the API half of `tt_model.c`.

    model_header(parts) -> tt_model.h text (api_header.py)        model_source(gen, parts) -> tt_model.c text

codegen.py emits the schedule (per-op kernel calls) into three static functions -- tt_forward, tt_sample_step,
tt_update_step -- and the state initialisation; this module wraps them into the API a product links:

    tt_init, tt_predict, tt_train_sample (accumulates, applies the update every TT_BATCH_SIZE samples),
    tt_apply_update, tt_loss_last, tt_steps_done, tt_evaluate_begin/add/end, tt_weights_size/read/export/import
    (.wof, stages/model/wof.py), tt_checkpoint_size/save/load (+ streaming variants), tt_set_* hyper-parameters,
    tt_arena_high_water.

No I/O and no malloc: the program's memory is `tt_arena` (the planned SRAM), the few statics listed in the header
and, for weights a reader cannot take split, whole static arrays (codegen.json `sram_outside_arena_bytes`).
The emulate-run firmware's `tt_main` (stages/c_emit/driver.py) is a client of exactly this API.

Checkpoint layout (version 1, little-endian, what stages/train/checkpoint.py reads):

    0   4  magic "TTCK"             16  4  steps (updates applied so far)
    4   4  version = 1              20  4  samples pending in the current batch (always 0: saved between batches)
    8   4  model id (CRC32 of the   24  4  state bytes S
           state layout below)      28  4  reserved 0
    12  4  total bytes = 32 + S + 4
    32  S  the state tensors, in the order of io_layout.json "checkpoint.tensors", each padded to 4 bytes
    32+S 4 CRC32 (IEEE 802.3, zlib's) of bytes [0, 32 + S)

The state is every tensor tt_init sets (trained weights -- the compact slice of a split weight --, optimizer
moments, Adam's step counter, fp32 master copies, the QAS stochastic-rounding PRNG streams): exactly what carries
from one step to the next, so a restored checkpoint continues bit for bit. Loading checks size, magic, version,
model id and CRC before it writes anything: a refused checkpoint leaves the model as it was.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from tinytrain.stages.c_emit.literals import flit
from tinytrain.stages.model.wof import ALIGN as WOF_ALIGN
from tinytrain.stages.model.wof import HEADER as WOF_HEADER
from tinytrain.stages.model.wof import HEADER_SIZE as WOF_HEADER_SIZE
from tinytrain.stages.model.wof import MAGIC as WOF_MAGIC
from tinytrain.stages.model.wof import SCHEMA_VERSION as WOF_VERSION

CKPT_MAGIC = b"TTCK"
CKPT_VERSION = 1
CKPT_HEADER = 32
API_VERSION = 1
# Hyper-parameters settable at run time: C setter suffix -> field of the generated `tt_cfg` (the names codegen's
# update emission reads, RUNTIME_FIELDS there).
SETTERS = ("learning_rate", "momentum", "beta1", "beta2", "eps", "alpha", "weight_decay")
ERRORS = [("TT_OK", 0, "ok"),
          ("TT_ERR_SIZE", -1, "checkpoint or weights image truncated or of the wrong size"),
          ("TT_ERR_MAGIC", -2, "not a tinytrain checkpoint / .wof image (bad magic)"),
          ("TT_ERR_VERSION", -3, "unsupported format version"),
          ("TT_ERR_MODEL", -4, "made for another model (state layout differs)"),
          ("TT_ERR_CRC", -5, "CRC mismatch: torn write or corrupted bytes"),
          ("TT_ERR_BUSY", -6, "samples of an unfinished batch are pending"),
          ("TT_ERR_TARGET", -7, "target out of range"),
          ("TT_ERR_IO", -8, "the read or write callback failed")]


@dataclass
class ApiParts:
    """What codegen.generate hands over: names are C expressions of the generated program."""
    input_expr: str
    input_bytes: int
    input_dtype: str              # int8 / float32
    input_q: tuple[float, int] | None
    output_expr: str
    output_bytes: int
    output_dtype: str
    output_q: tuple[float, int] | None
    label_expr: str
    loss_expr: str
    num_classes: int
    num_targets: int              # regression outputs (0 for classification)
    batch_size: int
    trained: list[dict[str, Any]]   # io order: name, nbytes, expr or split (whole, part, rows, cols, n), source_index
    state: list[dict[str, Any]]     # name, expr, nbytes
    wof_n_buffers: int
    defaults: dict[str, float]
    n_prof: int = 1
    # Heads evaluated by their training loss (train.outputs: several heads, or one bce / huber head): C lines adding
    # one sample's loss to `acc` from its float targets `t` (codegen_program._heads_eval); None: accuracy or MSE
    loss_eval: list[str] | None = None
    # A stateful model's per-frame inference (stages/c_emit/stream.py StreamParts); None for a stateless model
    stream: Any = None
    # Rows of the model input as a row source delivers them (NHWC: H rows of W*C; a flat input: one row)
    input_rows: int = 1
    # The model input fed to its first row stream row by row (stages/c_emit/row_feed.py: tensor, rows, row_bytes,
    # buffer_bytes); None: the input is whole in the arena at tt_input_buffer()
    input_feed: dict[str, Any] | None = None

    @property
    def input_buffer_bytes(self) -> int:
        return int(self.input_feed["buffer_bytes"]) if self.input_feed else self.input_bytes

    @property
    def regression(self) -> bool:
        """Float targets (TT_NUM_TARGETS per sample): MSE regression, or heads evaluated by their loss."""
        return self.num_targets > 0

    @property
    def loss_task(self) -> bool:
        return self.loss_eval is not None

    def model_id(self) -> int:
        desc = ";".join(f"{s['name']}:{s['nbytes']}" for s in self.state) + f"|B{self.batch_size}"
        return zlib.crc32(desc.encode()) & 0xFFFFFFFF

    def state_layout(self) -> list[dict[str, Any]]:
        off, out = CKPT_HEADER, []
        for s in self.state:
            out.append({"name": s["name"], "offset": off, "nbytes": s["nbytes"], "dtype": s["dtype"],
                        "role": s["role"]})
            off += -(-s["nbytes"] // 4) * 4
        return out

    def state_bytes(self) -> int:
        return sum(-(-s["nbytes"] // 4) * 4 for s in self.state)

    def wof_layout(self) -> tuple[list[int], int]:
        """(.wof offset of each trained tensor in io order, 0 when it has no original tensor index; image size)."""
        present = sorted((int(t["source_index"]), k) for k, t in enumerate(self.trained)
                         if t.get("source_index") is not None and int(t["source_index"]) < self.wof_n_buffers)
        offs = [0] * len(self.trained)
        pos = WOF_HEADER_SIZE + 4 * self.wof_n_buffers
        for _, k in present:
            pos += (-pos) % WOF_ALIGN
            offs[k] = pos
            pos += int(self.trained[k]["nbytes"])
        return offs, pos

    def wof_header(self) -> bytes:
        offs, _ = self.wof_layout()
        table = [0] * self.wof_n_buffers
        for k, t in enumerate(self.trained):
            if offs[k]:
                table[int(t["source_index"])] = offs[k]
        import struct
        return WOF_HEADER.pack(WOF_MAGIC, WOF_VERSION, 0, self.wof_n_buffers) + struct.pack(
            f"<{self.wof_n_buffers}I", *table)


def _c_bytes(b: bytes) -> str:
    rows = [", ".join(f"0x{v:02X}" for v in b[i:i + 16]) for i in range(0, len(b), 16)]
    return "{\n    " + ",\n    ".join(rows or ["0"]) + "\n}"


def _stream_source(p: ApiParts) -> str:
    s = p.stream
    if s is None or not s.ok:
        return ""
    ind = lambda ls: "\n".join("    " + ln.replace("\n", "\n    ") for ln in ls)  # noqa: E731
    return f"""
/* ---- streaming inference (stages/c_emit/stream.py): one invocation per call, the state in SRAM ---- */
{chr(10).join(s.globals)}

void tt_stream_reset(void)
{{
{ind(s.reset)}
}}

void tt_stream_step(const void *frame, void *output)
{{
{ind(s.body)}
}}
"""


def _input_source(p: ApiParts) -> str:
    """tt_set_rows (the input of the next forward comes from `source`) and tt_input_status (did every row come)."""
    if p.input_feed:
        return """/* The input is fed: the first row stream asks tt_feed for its rows (stages/c_emit/row_feed.py). */
static int tt_set_rows(tt_row_source_fn source, void *ctx)
{
    tt_feed.fn = source;
    tt_feed.ctx = ctx;
    tt_feed.next = 0u;
    tt_feed.status = 0;
    return TT_OK;
}

static int tt_input_status(void) { return tt_feed.status != 0 ? TT_ERR_IO : TT_OK; }
"""
    return f"""/* The input is whole in the arena: a source's rows are copied there first (none when given the buffer
 * itself). */
static int tt_set_rows(tt_row_source_fn source, void *ctx)
{{
    uint8_t *const x = (uint8_t *){p.input_expr};
    uint32_t r;
    if (source == tt_rows_from_memory && ctx == (void *)x) {{
        return TT_OK;
    }}
    for (r = 0; r < TT_INPUT_ROWS; ++r) {{
        if (source(ctx, r, x + r * TT_INPUT_ROW_BYTES, TT_INPUT_ROW_BYTES) != 0) {{
            return TT_ERR_IO;
        }}
    }}
    return TT_OK;
}}

static int tt_input_status(void) {{ return TT_OK; }}
"""


def model_api(p: ApiParts, paint: int) -> str:
    """The API functions of tt_model.c (after the static program functions)."""
    offs, wof_size = p.wof_layout()
    hdr = p.wof_header()
    trained_rows = []
    for t in p.trained:
        if "split" in t:
            whole, part, rows, cols, n = t["split"]
            trained_rows.append(f"    {{(const uint8_t *){whole}, (const uint8_t *){part}, {t['nbytes']}u, {cols}u, "
                                f"{n}u}},")
        else:
            trained_rows.append(f"    {{(const uint8_t *){t['expr']}, 0, {t['nbytes']}u, 0u, 0u}},")
    state_rows = [f"    {{(uint8_t *){s['expr']}, {s['nbytes']}u}}, /* {s['name']} */" for s in p.state]
    wof_rows = [f"    {o}u," for o in offs]
    idx_rows = [f"    {int(t['source_index']) if offs[k] else 0}u," for k, t in enumerate(p.trained)]
    setters = "\n".join(f"void tt_set_{s}(float v) {{ tt_cfg.{s} = v; }}" for s in SETTERS)
    errs = "\n".join(f"    case {n}: return \"{why}\";" for n, _, why in ERRORS)
    if p.loss_task:
        set_target = f"    memcpy({p.label_expr}, target, TT_NUM_TARGETS * sizeof(float));\n"
        body = "\n".join("        " + ln for ln in p.loss_eval)
        eval_acc = f"""    {{
        const float *t = (const float *)target;
        float acc = 0.0f, l = 0.0f;
{body}
        tt_eval_sum += acc;
    }}
"""
        eval_end = ("    result->mse = 0.0f;\n"
                    "    result->loss = tt_eval_count ? tt_eval_sum / (float)tt_eval_count : 0.0f;\n")
    elif p.regression:
        set_target = f"    memcpy({p.label_expr}, target, TT_NUM_TARGETS * sizeof(float));\n"
        # The prediction is read element by element (an int8 head dequantized as tt_dequantize_s8_f32 does, bit for
        # bit): no output-sized float copy outside the arena (planning/statics.py counts what is left).
        if p.output_dtype == "int8":
            s, z = p.output_q
            y_k = f"(float)((double){flit(s)} * (double)((int32_t){p.output_expr}[k] - {z}))"
        else:
            y_k = f"{p.output_expr}[k]"
        eval_acc = f"""    {{
        const float *t = (const float *)target;
        float acc = 0.0f;
        uint32_t k;
        for (k = 0; k < TT_NUM_TARGETS; ++k) {{
            const float d = {y_k} - t[k];
            acc += d * d;
        }}
        tt_eval_sum += acc / (float)TT_NUM_TARGETS;
    }}
"""
        eval_end = "    result->mse = tt_eval_count ? tt_eval_sum / (float)tt_eval_count : 0.0f;\n"
    else:
        set_target = f"""    {{
        int32_t label;
        memcpy(&label, target, sizeof label);
        if (label < 0 || label >= TT_NUM_CLASSES) {{
            return TT_ERR_TARGET;
        }}
        {p.label_expr}[0] = label;
    }}
"""
        argmax = "tt_argmax_s8" if p.output_dtype == "int8" else "tt_argmax_f32"
        eval_acc = f"""    {{
        int32_t label;
        memcpy(&label, target, sizeof label);
        tt_eval_correct += ({argmax}(TT_NUM_CLASSES, {p.output_expr}) == label) ? 1u : 0u;
    }}
"""
        eval_end = "    result->mse = 0.0f;\n"
    return _stream_source(p) + f"""
/* ---- the API (tt_model.h) --------------------------------------------------------------------------------- */

static uint32_t tt_steps;       /* updates applied since tt_init */
static uint32_t tt_pending;     /* samples accumulated towards the next update */
static float tt_loss;           /* loss of the last training sample */
static uint32_t tt_eval_count, tt_eval_correct;
static float tt_eval_sum;

{setters}
void tt_set_seed(uint32_t seed) {{ tt_cfg.seed = seed; }}

void tt_init(void)
{{
    const uint32_t p = 0x{paint:08X}u;
    uint32_t i;
    for (i = 0; i + 4u <= TT_ARENA_SIZE; i += 4u) {{ /* painted: tt_arena_high_water finds what was written */
        memcpy(tt_arena + i, &p, 4);
    }}
    tt_init_state();
{'    tt_stream_reset();' + chr(10) if p.stream is not None and p.stream.ok else ''}    tt_steps = 0;
    tt_pending = 0;
    tt_loss = 0.0f;
}}

uint32_t tt_arena_bytes(void) {{ return TT_ARENA_PLANNED; }}

uint32_t tt_arena_high_water(void)
{{
    uint32_t i = TT_ARENA_SIZE - TT_ARENA_SIZE % 4u;
    while (i > 0) {{
        uint32_t w;
        memcpy(&w, tt_arena + i - 4u, 4);
        if (w != 0x{paint:08X}u) {{
            break;
        }}
        i -= 4u;
    }}
    return i;
}}

void *tt_input_buffer(void) {{ return {p.input_expr}; }}
const void *tt_output_buffer(void) {{ return {p.output_expr}; }}

{_input_source(p)}
int tt_predict_rows(tt_row_source_fn source, void *ctx, void *output)
{{
    if (tt_set_rows(source, ctx) != TT_OK) {{
        return TT_ERR_IO;
    }}
    tt_forward();
    if (tt_input_status() != TT_OK) {{
        return TT_ERR_IO;
    }}
    if (output != 0) {{
        memcpy(output, {p.output_expr}, TT_OUTPUT_BYTES);
    }}
    return TT_OK;
}}

void tt_predict(const void *input, void *output)
{{
    (void)tt_predict_rows(tt_rows_from_memory, (void *)input, output);
}}

int tt_train_sample(const void *input, const void *target)
{{
    return tt_train_sample_rows(tt_rows_from_memory, (void *)input, target);
}}

int tt_train_sample_rows(tt_row_source_fn source, void *ctx, const void *target)
{{
{set_target}    if (tt_set_rows(source, ctx) != TT_OK) {{
        return TT_ERR_IO;
    }}
    tt_sample_step();
    if (tt_input_status() != TT_OK) {{
        return TT_ERR_IO;
    }}
    tt_loss = {p.loss_expr}[0];
    if (++tt_pending == TT_BATCH_SIZE) {{
        tt_update_step();
        tt_pending = 0;
        ++tt_steps;
        return 1;
    }}
    return 0;
}}

int tt_apply_update(void)
{{
    const uint32_t n = tt_pending;
    if (n == 0) {{
        return 0;
    }}
    tt_update_step();
    tt_pending = 0;
    ++tt_steps;
    return (int)n;
}}

float tt_loss_last(void) {{ return tt_loss; }}
uint32_t tt_steps_done(void) {{ return tt_steps; }}
uint32_t tt_samples_pending(void) {{ return tt_pending; }}

void tt_evaluate_begin(void)
{{
    tt_eval_count = 0;
    tt_eval_correct = 0;
    tt_eval_sum = 0.0f;
}}

int tt_evaluate_add(const void *input, const void *target)
{{
    return tt_evaluate_add_rows(tt_rows_from_memory, (void *)input, target);
}}

int tt_evaluate_add_rows(tt_row_source_fn source, void *ctx, const void *target)
{{
    if (tt_set_rows(source, ctx) != TT_OK) {{
        return TT_ERR_IO;
    }}
    tt_forward();
    if (tt_input_status() != TT_OK) {{
        return TT_ERR_IO;
    }}
{eval_acc}    ++tt_eval_count;
    return TT_OK;
}}

void tt_evaluate_end(tt_eval_result *result)
{{
    result->count = tt_eval_count;
    result->correct = tt_eval_correct;
{eval_end}}}

/* ---- trained tensors and .wof ---- */
typedef struct {{
    const uint8_t *data;   /* whole tensor, or the flash original of a split weight */
    const uint8_t *part;   /* split weight: the trained slice [..., :n] (rows of n bytes), else 0 */
    uint32_t nbytes, cols, n;
}} tt_trained_desc;

static const tt_trained_desc tt_trained_tab[{max(len(p.trained), 1)}] = {{
{chr(10).join(trained_rows) or '    {0, 0, 0u, 0u, 0u},'}
}};
static const uint32_t tt_wof_off[{max(len(p.trained), 1)}] = {{
{chr(10).join(wof_rows) or '    0u,'}
}};
static const uint32_t tt_wof_idx[{max(len(p.trained), 1)}] = {{ /* original tensor index */
{chr(10).join(idx_rows) or '    0u,'}
}};
/* .wof header and offset table ({len(hdr)} bytes, flash) */
static const uint8_t tt_wof_head[{len(hdr)}] = {_c_bytes(hdr)};

uint32_t tt_trained_size(uint32_t k) {{ return k < TT_TRAINED_COUNT ? tt_trained_tab[k].nbytes : 0u; }}

uint32_t tt_trained_read(uint32_t k, uint32_t offset, void *buf, uint32_t len)
{{
    const tt_trained_desc *d;
    uint8_t *o = (uint8_t *)buf;
    uint32_t i;
    if (k >= TT_TRAINED_COUNT || offset >= tt_trained_tab[k].nbytes) {{
        return 0;
    }}
    d = &tt_trained_tab[k];
    if (len > d->nbytes - offset) {{
        len = d->nbytes - offset;
    }}
    if (d->part == 0) {{
        memcpy(o, d->data + offset, len);
        return len;
    }}
    for (i = 0; i < len; ++i) {{ /* merged: channels [0, n) from the trained slice, the rest from flash */
        const uint32_t j = offset + i, r = j / d->cols, c = j % d->cols;
        o[i] = c < d->n ? d->part[r * d->n + c] : d->data[j];
    }}
    return len;
}}

uint32_t tt_weights_size(void) {{ return TT_WEIGHTS_BYTES; }}

uint32_t tt_weights_read(uint32_t offset, void *buf, uint32_t len)
{{
    uint8_t *o = (uint8_t *)buf;
    uint32_t done = 0;
    if (offset >= TT_WEIGHTS_BYTES) {{
        return 0;
    }}
    if (len > TT_WEIGHTS_BYTES - offset) {{
        len = TT_WEIGHTS_BYTES - offset;
    }}
    while (done < len) {{
        const uint32_t at = offset + done;
        uint32_t k, n = 0;
        if (at < sizeof tt_wof_head) {{
            n = (uint32_t)sizeof tt_wof_head - at;
            n = n < len - done ? n : len - done;
            memcpy(o + done, tt_wof_head + at, n);
        }} else {{
            for (k = 0; k < TT_TRAINED_COUNT; ++k) {{
                if (tt_wof_off[k] != 0 && at >= tt_wof_off[k] && at < tt_wof_off[k] + tt_trained_tab[k].nbytes) {{
                    n = tt_trained_read(k, at - tt_wof_off[k], o + done, len - done);
                    break;
                }}
            }}
            if (n == 0) {{ /* alignment padding */
                o[done] = 0;
                n = 1;
            }}
        }}
        done += n;
    }}
    return len;
}}

int tt_weights_export(void *buf)
{{
    return tt_weights_read(0, buf, TT_WEIGHTS_BYTES) == TT_WEIGHTS_BYTES ? TT_OK : TT_ERR_SIZE;
}}

static uint32_t tt_rd32(const uint8_t *b) {{ return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24); }}

static void tt_wr32(uint8_t *b, uint32_t v)
{{
    b[0] = (uint8_t)v; b[1] = (uint8_t)(v >> 8); b[2] = (uint8_t)(v >> 16); b[3] = (uint8_t)(v >> 24);
}}

int tt_weights_import(const void *buf, uint32_t len)
{{
    const uint8_t *b = (const uint8_t *)buf;
    uint32_t k, pass;
    if (len < sizeof tt_wof_head) {{
        return TT_ERR_SIZE;
    }}
    if ((b[0] | (b[1] << 8)) != {WOF_MAGIC}) {{
        return TT_ERR_MAGIC;
    }}
    if (b[2] != {WOF_VERSION}u) {{
        return TT_ERR_VERSION;
    }}
    if (tt_rd32(b + 4) != {p.wof_n_buffers}u) {{
        return TT_ERR_MODEL;
    }}
    for (pass = 0; pass < 2; ++pass) {{ /* pass 0 checks every tensor, pass 1 writes: all or nothing */
        for (k = 0; k < TT_TRAINED_COUNT; ++k) {{
            const tt_trained_desc *d = &tt_trained_tab[k];
            uint32_t off;
            if (tt_wof_off[k] == 0) {{
                continue;
            }}
            off = tt_rd32(b + 8u + 4u * tt_wof_idx[k]);
            if (off == 0u || off == 0xFFFFFFFFu || off > len || len - off < d->nbytes) {{
                return TT_ERR_SIZE;
            }}
            if (pass == 1) {{
                uint8_t *dst = (uint8_t *)(d->part != 0 ? d->part : d->data);
                if (d->part == 0) {{
                    memcpy(dst, b + off, d->nbytes);
                }} else {{
                    uint32_t r, rows = d->nbytes / d->cols;
                    for (r = 0; r < rows; ++r) {{
                        memcpy(dst + r * d->n, b + off + r * d->cols, d->n);
                    }}
                }}
            }}
        }}
    }}
    return TT_OK;
}}

/* ---- checkpoints ---- */
typedef struct {{
    uint8_t *data;
    uint32_t nbytes;
}} tt_state_desc;

static const tt_state_desc tt_state_tab[{max(len(p.state), 1)}] = {{
{chr(10).join(state_rows) or '    {0, 0u},'}
}};
#define TT_STATE_COUNT {len(p.state)}u

uint32_t tt_checkpoint_size(void) {{ return TT_CHECKPOINT_BYTES; }}

static uint32_t tt_crc32(uint32_t crc, const uint8_t *b, uint32_t n)
{{
    uint32_t i, k;
    crc = ~crc;
    for (i = 0; i < n; ++i) {{ /* bitwise, no table: 0 bytes of flash for 8 shifts a byte */
        crc ^= b[i];
        for (k = 0; k < 8u; ++k) {{
            crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
        }}
    }}
    return ~crc;
}}

static void tt_ckpt_header(uint8_t *h)
{{
    memset(h, 0, {CKPT_HEADER});
    h[0] = 'T'; h[1] = 'T'; h[2] = 'C'; h[3] = 'K';
    tt_wr32(h + 4, TT_CHECKPOINT_VERSION);
    tt_wr32(h + 8, TT_MODEL_ID);
    tt_wr32(h + 12, TT_CHECKPOINT_BYTES);
    tt_wr32(h + 16, tt_steps);
    tt_wr32(h + 20, tt_pending);
    tt_wr32(h + 24, TT_CHECKPOINT_BYTES - {CKPT_HEADER + 4}u);
}}

int tt_checkpoint_save_to(tt_write_fn write, void *ctx)
{{
    static const uint8_t zeros[4] = {{0, 0, 0, 0}};
    uint8_t h[{CKPT_HEADER}];
    uint32_t crc, k;
    if (tt_pending != 0) {{
        return TT_ERR_BUSY;
    }}
    tt_ckpt_header(h);
    crc = tt_crc32(0, h, sizeof h);
    if (write(ctx, h, sizeof h) != 0) {{
        return TT_ERR_IO;
    }}
    for (k = 0; k < TT_STATE_COUNT; ++k) {{
        const uint32_t pad = (4u - tt_state_tab[k].nbytes % 4u) % 4u;
        crc = tt_crc32(crc, tt_state_tab[k].data, tt_state_tab[k].nbytes);
        crc = tt_crc32(crc, zeros, pad);
        if (write(ctx, tt_state_tab[k].data, tt_state_tab[k].nbytes) != 0 || (pad && write(ctx, zeros, pad) != 0)) {{
            return TT_ERR_IO;
        }}
    }}
    tt_wr32(h, crc);
    return write(ctx, h, 4) == 0 ? TT_OK : TT_ERR_IO;
}}

typedef struct {{
    uint8_t *at;
}} tt_mem_sink;

static int tt_mem_write(void *ctx, const void *data, uint32_t len)
{{
    tt_mem_sink *s = (tt_mem_sink *)ctx;
    memcpy(s->at, data, len);
    s->at += len;
    return 0;
}}

static int tt_mem_read(void *ctx, uint32_t offset, void *data, uint32_t len)
{{
    memcpy(data, (const uint8_t *)ctx + offset, len);
    return 0;
}}

int tt_checkpoint_save(void *buf)
{{
    tt_mem_sink s;
    s.at = (uint8_t *)buf;
    return tt_checkpoint_save_to(tt_mem_write, &s);
}}

int tt_checkpoint_load_from(tt_read_fn read, void *ctx, uint32_t len)
{{
    uint8_t h[{CKPT_HEADER}], chunk[64];
    uint32_t crc, at, k;
    if (len < {CKPT_HEADER + 4}u) {{
        return TT_ERR_SIZE;
    }}
    if (read(ctx, 0, h, sizeof h) != 0) {{
        return TT_ERR_IO;
    }}
    if (h[0] != 'T' || h[1] != 'T' || h[2] != 'C' || h[3] != 'K') {{
        return TT_ERR_MAGIC;
    }}
    if (tt_rd32(h + 4) != TT_CHECKPOINT_VERSION) {{
        return TT_ERR_VERSION;
    }}
    if (tt_rd32(h + 8) != TT_MODEL_ID || tt_rd32(h + 24) != TT_CHECKPOINT_BYTES - {CKPT_HEADER + 4}u) {{
        return TT_ERR_MODEL;
    }}
    if (tt_rd32(h + 12) != TT_CHECKPOINT_BYTES || len != TT_CHECKPOINT_BYTES) {{
        return TT_ERR_SIZE;
    }}
    crc = tt_crc32(0, h, sizeof h);
    for (at = sizeof h; at < TT_CHECKPOINT_BYTES - 4u; at += k) {{ /* pass 1: the CRC, before anything changes */
        k = TT_CHECKPOINT_BYTES - 4u - at;
        k = k < sizeof chunk ? k : (uint32_t)sizeof chunk;
        if (read(ctx, at, chunk, k) != 0) {{
            return TT_ERR_IO;
        }}
        crc = tt_crc32(crc, chunk, k);
    }}
    if (read(ctx, TT_CHECKPOINT_BYTES - 4u, chunk, 4) != 0) {{
        return TT_ERR_IO;
    }}
    if (tt_rd32(chunk) != crc || tt_rd32(h + 20) != 0u) {{
        return TT_ERR_CRC;
    }}
    at = sizeof h;
    for (k = 0; k < TT_STATE_COUNT; ++k) {{ /* pass 2: apply */
        if (read(ctx, at, tt_state_tab[k].data, tt_state_tab[k].nbytes) != 0) {{
            return TT_ERR_IO; /* a source that fails between two reads of the same bytes: state is partial */
        }}
        at += (tt_state_tab[k].nbytes + 3u) & ~3u;
    }}
    tt_steps = tt_rd32(h + 16);
    tt_pending = 0;
    return TT_OK;
}}

int tt_checkpoint_load(const void *buf, uint32_t len)
{{
    return tt_checkpoint_load_from(tt_mem_read, (void *)(uintptr_t)buf, len);
}}

const char *tt_strerror(int code)
{{
    switch (code) {{
{errs}
    default: return "unknown error";
    }}
}}
"""
