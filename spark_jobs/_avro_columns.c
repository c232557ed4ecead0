/* spark_jobs._avro_columns: flat Avro records -> Arrow column buffers, in C.
 *
 * decode() walks a list of Confluent wire-format values written with one
 * writer schema (a flat record, compiled by spark_jobs/avro_columns.py into a
 * column program) and appends each field straight to the buffers of an Arrow
 * column: validity bitmaps, fixed-width values, int32 offsets + data for
 * strings and binaries. No Python object is made per value.
 *
 * The decoding is fastavro's (``schemaless_reader``), quirks included, so that
 * a chunk decodes to the same rows and the same error rows either way:
 * varints of any length (bits past 64 wrap as fastavro's shift does), booleans
 * true for any non-zero byte, enum symbol and union branch indexes that may
 * be negative (Python list indexing), strict UTF-8 as Python's decoder, and
 * the ranges of fastavro's date and timestamp conversions. Ints are read as
 * 64-bit values; one that does not fit an int32 column is an Arrow conversion
 * error of its row (as pa.array reports it), not a decode error.
 *
 * Everything is bounds-checked: any bytes (and any program bytes) give rows,
 * error rows or a Python exception, never a crash.
 *
 * Program layout (all integers little-endian):
 *   "AVC1" | u32 ncols | u8 kind[ncols] | u32 nfields | field[nfields]
 *   field: u8 op | u8 union | u32 column (NO_COLUMN: parsed, not kept)
 *          | u32 name length | name | (enum only) u32 nsymbols, {u32 length, bytes}[nsymbols]
 * spark_jobs/avro_columns.py must agree.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../broker/_utf8.h"

#define NO_COLUMN 0xFFFFFFFFu

enum { /* column kinds: the Arrow buffers a column gets */
    COL_BOOL = 1,  /* validity + values bitmap */
    COL_I32 = 2,   /* validity + int32 (int, date32) */
    COL_I64 = 3,   /* validity + int64 (long, timestamp[us]) */
    COL_F32 = 4,   /* validity + float32 */
    COL_F64 = 5,   /* validity + float64 */
    COL_BIN = 6,   /* validity + int32 offsets + data (string, binary) */
};

enum { /* field ops: the writer's type */
    OP_NULL = 0,
    OP_BOOLEAN = 1,
    OP_INT = 2,
    OP_LONG = 3,
    OP_FLOAT = 4,
    OP_DOUBLE = 5,
    OP_STRING = 6,
    OP_BYTES = 7,
    OP_ENUM = 8,
    OP_DATE = 9,          /* int, logicalType date */
    OP_TS_MILLIS = 10,    /* long, (local-)timestamp-millis: microseconds kept */
    OP_TS_MICROS = 11,    /* long, (local-)timestamp-micros */
    OP_LAST = 11,
};

enum { /* field unions */
    U_NONE = 0,
    U_NULL_FIRST = 1,   /* ["null", T] */
    U_NULL_SECOND = 2,  /* [T, "null"] */
    U_NULL_ONLY = 3,    /* ["null"] */
};

enum { /* bad row kinds, as spark_jobs/avro_columns.py names them */
    BAD_DECODE = 1,
    BAD_TRAILING = 2,
    BAD_CONVERSION = 3,
};

/* The values fastavro's logical readers convert without an error
 * (date.fromordinal, epoch + timedelta): broker/avro_program.py's ranges. */
#define DATE_MIN (-719162LL)
#define DATE_MAX 2932896LL
#define TS_MILLIS_MIN (-62135596800000LL)
#define TS_MILLIS_MAX 253402300799999LL
#define TS_MICROS_MIN (-62135596800000000LL)
#define TS_MICROS_MAX 253402300799999999LL

typedef struct {
    uint8_t op, unio;
    uint32_t col;
    const char *name;
    uint32_t name_len;
    uint32_t nsym;
    const uint8_t **sym;  /* enum symbols (pointers into the program) */
    uint32_t *sym_len;
} Field;

typedef struct {
    uint8_t kind;
    PyObject *valid_obj, *vals_obj;  /* bytes, written in place until returned */
    uint8_t *valid, *vals;
    char *data;                      /* COL_BIN: malloc'd, grows */
    size_t data_len, data_cap;
} Column;

typedef struct {
    uint32_t ncols, nfields;
    const uint8_t *kinds;
    Field *fields;
    const uint8_t **syms;  /* one allocation for every enum's symbol pointers */
    uint32_t *sym_lens;
} Program;

static inline uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* ------------------------------------------------------------------ the program */

static void program_free(Program *p) {
    PyMem_Free(p->fields);
    PyMem_Free(p->syms);
    PyMem_Free(p->sym_lens);
    p->fields = NULL;
    p->syms = NULL;
    p->sym_lens = NULL;
}

static int bad_program(const char *what) {
    PyErr_Format(PyExc_ValueError, "invalid column program: %s", what);
    return -1;
}

static int valid_sink(uint8_t op, uint8_t kind) {
    switch (op) {
    case OP_BOOLEAN: return kind == COL_BOOL;
    case OP_INT: return kind == COL_I32 || kind == COL_I64;
    case OP_DATE: return kind == COL_I32;
    case OP_LONG: case OP_TS_MILLIS: case OP_TS_MICROS: return kind == COL_I64;
    case OP_FLOAT: return kind == COL_F32 || kind == COL_F64;
    case OP_DOUBLE: return kind == COL_F64;
    case OP_STRING: case OP_BYTES: case OP_ENUM: return kind == COL_BIN;
    default: return 0;  /* a null field keeps no column */
    }
}

static int program_load(Program *p, const uint8_t *code, Py_ssize_t len) {
    memset(p, 0, sizeof *p);
    Py_ssize_t pos = 0;
#define NEED(n) do { if ((Py_ssize_t)(n) > len - pos) { program_free(p); return bad_program("truncated"); } } while (0)
    NEED(8);
    if (memcmp(code, "AVC1", 4) != 0)
        return bad_program("bad magic");
    p->ncols = rd_u32(code + 4);
    pos = 8;
    NEED(p->ncols);
    p->kinds = code + pos;
    for (uint32_t c = 0; c < p->ncols; c++)
        if (p->kinds[c] < COL_BOOL || p->kinds[c] > COL_BIN)
            return bad_program("unknown column kind");
    pos += p->ncols;
    NEED(4);
    p->nfields = rd_u32(code + pos);
    pos += 4;
    if (p->nfields > (uint32_t)(len / 10))  /* every field takes at least 10 bytes */
        return bad_program("field count");
    p->fields = PyMem_Calloc(p->nfields ? p->nfields : 1, sizeof(Field));
    if (p->fields == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    /* first pass: count enum symbols */
    uint64_t total_syms = 0;
    Py_ssize_t start = pos;
    for (int pass = 0; pass < 2; pass++) {
        pos = start;
        uint64_t next_sym = 0;
        for (uint32_t f = 0; f < p->nfields; f++) {
            Field *fd = &p->fields[f];
            NEED(10);
            fd->op = code[pos];
            fd->unio = code[pos + 1];
            fd->col = rd_u32(code + pos + 2);
            fd->name_len = rd_u32(code + pos + 6);
            pos += 10;
            if (fd->op > OP_LAST || fd->unio > U_NULL_ONLY) {
                program_free(p);
                return bad_program("unknown op");
            }
            if (fd->col != NO_COLUMN && (fd->col >= p->ncols || !valid_sink(fd->op, p->kinds[fd->col]))) {
                program_free(p);
                return bad_program("bad column");
            }
            NEED(fd->name_len);
            fd->name = (const char *)code + pos;
            pos += fd->name_len;
            if (fd->op == OP_ENUM) {
                NEED(4);
                fd->nsym = rd_u32(code + pos);
                pos += 4;
                if (pass == 1) {
                    fd->sym = p->syms + next_sym;
                    fd->sym_len = p->sym_lens + next_sym;
                }
                for (uint32_t s = 0; s < fd->nsym; s++) {
                    NEED(4);
                    uint32_t n = rd_u32(code + pos);
                    pos += 4;
                    NEED(n);
                    if (pass == 1) {
                        fd->sym[s] = code + pos;
                        fd->sym_len[s] = n;
                    }
                    pos += n;
                }
                next_sym += fd->nsym;
            }
        }
        if (pass == 0) {
            total_syms = next_sym;
            p->syms = PyMem_Calloc(total_syms ? total_syms : 1, sizeof(uint8_t *));
            p->sym_lens = PyMem_Calloc(total_syms ? total_syms : 1, sizeof(uint32_t));
            if (p->syms == NULL || p->sym_lens == NULL) {
                program_free(p);
                PyErr_NoMemory();
                return -1;
            }
        }
    }
    if (pos != len) {
        program_free(p);
        return bad_program("trailing bytes");
    }
#undef NEED
    return 0;
}

/* ------------------------------------------------------------------ reading */

typedef struct {
    const uint8_t *v;
    Py_ssize_t pos, len;
    char msg[200];
} Reader;

static int rd_fail(Reader *r, const Field *f, const char *fmt, ...) {
    va_list ap;
    int n = PyOS_snprintf(r->msg, sizeof r->msg, "field %.*s: ", (int)(f->name_len > 80 ? 80 : f->name_len),
                          f->name);
    if (n < 0 || n >= (int)sizeof r->msg)
        n = 0;
    va_start(ap, fmt);
    PyOS_vsnprintf(r->msg + n, sizeof r->msg - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* A zigzag varint as fastavro reads it: any length; a byte's bits shift by
 * (7 * i) mod 64 (fastavro's C shift on x86), so long garbage wraps, not fails. */
static inline int rd_long(Reader *r, const Field *f, int64_t *out, const char *what) {
    if (r->pos < r->len && r->v[r->pos] < 0x80) {
        uint64_t one = r->v[r->pos++];
        *out = (int64_t)((one >> 1) ^ (~(one & 1) + 1));
        return 0;
    }
    uint64_t raw = 0;
    unsigned shift = 0;
    const Py_ssize_t start = r->pos;
    *out = 0;
    for (;;) {
        if (r->pos >= r->len)
            return rd_fail(r, f, "%s runs past the end at byte %zd", what, start);
        uint8_t b = r->v[r->pos++];
        raw |= (uint64_t)(b & 0x7F) << (shift & 63);
        if (!(b & 0x80))
            break;
        shift += 7;
    }
    *out = (int64_t)((raw >> 1) ^ (~(raw & 1) + 1));
    return 0;
}

/* ------------------------------------------------------------------ columns */

static inline void bit_set(uint8_t *bits, Py_ssize_t i) { bits[i >> 3] |= (uint8_t)(1u << (i & 7)); }
static inline void bit_clear(uint8_t *bits, Py_ssize_t i) { bits[i >> 3] &= (uint8_t)~(1u << (i & 7)); }

static int column_append(Column *c, const uint8_t *s, size_t n) {
    if (n > (size_t)INT32_MAX - c->data_len)
        return -1;  /* more than Arrow's 32-bit offsets hold */
    if (c->data_len + n > c->data_cap) {
        size_t cap = c->data_cap ? c->data_cap : 4096;
        while (cap < c->data_len + n)
            cap *= 2;
        char *grown = PyMem_Realloc(c->data, cap);
        if (grown == NULL)
            return -2;
        c->data = grown;
        c->data_cap = cap;
    }
    if (n)
        memcpy(c->data + c->data_len, s, n);
    c->data_len += n;
    return 0;
}

static Py_ssize_t popcount(const uint8_t *bits, Py_ssize_t nbytes) {
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < nbytes; i++)
        total += __builtin_popcount(bits[i]);
    return total;
}

/* ------------------------------------------------------------------ one row */

enum { ROW_OK = 0, ROW_BAD = -1, ROW_ERROR = -2 };

/* Decode one body into row i of the columns. ROW_BAD: r->msg and *kind say why;
 * ROW_ERROR: a Python exception (out of memory, too much string data). */
static int decode_row(const Program *p, Column *cols, Reader *r, Py_ssize_t i, int *kind) {
    int conversion = 0;
    char conversion_msg[200] = "";
    for (uint32_t fi = 0; fi < p->nfields; fi++) {
        const Field *f = &p->fields[fi];
        if (f->unio != U_NONE) {
            int64_t idx;
            if (rd_long(r, f, &idx, "union index") < 0)
                goto bad;
            int64_t nb = f->unio == U_NULL_ONLY ? 1 : 2;
            if (idx < -nb || idx >= nb) {
                rd_fail(r, f, "union index %lld is out of range at byte %zd", (long long)idx, r->pos);
                goto bad;
            }
            if (idx < 0)
                idx += nb;
            if (idx == (f->unio == U_NULL_SECOND ? 1 : 0))
                continue;  /* the null branch */
        }
        Column *c = f->col == NO_COLUMN ? NULL : &cols[f->col];
        int64_t v;
        switch (f->op) {
        case OP_NULL:
            break;
        case OP_BOOLEAN:
            if (r->pos >= r->len) {
                rd_fail(r, f, "boolean runs past the end at byte %zd", r->pos);
                goto bad;
            }
            if (c) {
                if (r->v[r->pos])
                    bit_set(c->vals, i);
                bit_set(c->valid, i);
            }
            r->pos++;
            break;
        case OP_INT:
        case OP_LONG:
        case OP_DATE:
        case OP_TS_MILLIS:
        case OP_TS_MICROS: {
            Py_ssize_t at = r->pos;
            if (rd_long(r, f, &v, f->op == OP_INT || f->op == OP_DATE ? "int" : "long") < 0)
                goto bad;
            if (f->op == OP_DATE && (v < DATE_MIN || v > DATE_MAX)) {
                rd_fail(r, f, "date %lld (days) is outside the years 1-9999 at byte %zd", (long long)v, at);
                goto bad;
            }
            if (f->op == OP_TS_MILLIS) {
                if (v < TS_MILLIS_MIN || v > TS_MILLIS_MAX) {
                    rd_fail(r, f, "timestamp %lld (ms) is outside the years 1-9999 at byte %zd", (long long)v, at);
                    goto bad;
                }
                v *= 1000;
            }
            if (f->op == OP_TS_MICROS && (v < TS_MICROS_MIN || v > TS_MICROS_MAX)) {
                rd_fail(r, f, "timestamp %lld (us) is outside the years 1-9999 at byte %zd", (long long)v, at);
                goto bad;
            }
            if (!c)
                break;
            if (c->kind == COL_I32) {
                if (v < INT32_MIN || v > INT32_MAX) {
                    if (!conversion) {
                        conversion = 1;
                        PyOS_snprintf(conversion_msg, sizeof conversion_msg,
                                      "field %.*s: %lld does not fit a 32-bit int column",
                                      (int)(f->name_len > 80 ? 80 : f->name_len), f->name, (long long)v);
                    }
                    break;
                }
                int32_t w = (int32_t)v;
                memcpy(c->vals + 4 * i, &w, 4);
            } else {
                memcpy(c->vals + 8 * i, &v, 8);
            }
            bit_set(c->valid, i);
            break;
        }
        case OP_FLOAT: {
            if (r->len - r->pos < 4) {
                rd_fail(r, f, "float runs past the end at byte %zd", r->pos);
                goto bad;
            }
            uint32_t bits = rd_u32(r->v + r->pos);
            r->pos += 4;
            if (c) {
                float x;
                memcpy(&x, &bits, 4);
                volatile double d = x;  /* as fastavro: a Python float, then Arrow's float32 */
                if (c->kind == COL_F32) {
                    float y = (float)d;
                    memcpy(c->vals + 4 * i, &y, 4);
                } else {
                    double y = d;
                    memcpy(c->vals + 8 * i, &y, 8);
                }
                bit_set(c->valid, i);
            }
            break;
        }
        case OP_DOUBLE:
            if (r->len - r->pos < 8) {
                rd_fail(r, f, "double runs past the end at byte %zd", r->pos);
                goto bad;
            }
            if (c) {
                uint64_t bits = (uint64_t)rd_u32(r->v + r->pos) | ((uint64_t)rd_u32(r->v + r->pos + 4) << 32);
                memcpy(c->vals + 8 * i, &bits, 8);
                bit_set(c->valid, i);
            }
            r->pos += 8;
            break;
        case OP_STRING:
        case OP_BYTES: {
            int64_t n;
            Py_ssize_t at = r->pos;
            const char *what = f->op == OP_STRING ? "string" : "bytes";
            if (rd_long(r, f, &n, f->op == OP_STRING ? "string length" : "bytes length") < 0)
                goto bad;
            if (n < 0) {
                rd_fail(r, f, "%s length %lld is negative at byte %zd", what, (long long)n, at);
                goto bad;
            }
            if (n > (int64_t)(r->len - r->pos)) {
                rd_fail(r, f, "%s of %lld bytes runs past the end at byte %zd", what, (long long)n, at);
                goto bad;
            }
            const uint8_t *s = r->v + r->pos;
            if (f->op == OP_STRING) {
                Py_ssize_t badat = utf8_invalid_at(s, (Py_ssize_t)n);
                if (badat >= 0) {
                    rd_fail(r, f, "string is not valid UTF-8 at byte %zd", r->pos + badat);
                    goto bad;
                }
            }
            r->pos += (Py_ssize_t)n;
            if (c) {
                int rc = column_append(c, s, (size_t)n);
                if (rc == -1) {
                    PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of string data in one column");
                    return ROW_ERROR;
                }
                if (rc == -2) {
                    PyErr_NoMemory();
                    return ROW_ERROR;
                }
                bit_set(c->valid, i);
            }
            break;
        }
        case OP_ENUM: {
            int64_t idx;
            Py_ssize_t at = r->pos;
            if (rd_long(r, f, &idx, "enum index") < 0)
                goto bad;
            int64_t ns = f->nsym;
            if (idx < -ns || idx >= ns) {
                rd_fail(r, f, "enum index %lld is out of range at byte %zd", (long long)idx, at);
                goto bad;
            }
            if (idx < 0)
                idx += ns;
            if (c) {
                int rc = column_append(c, f->sym[idx], f->sym_len[idx]);
                if (rc == -1) {
                    PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of string data in one column");
                    return ROW_ERROR;
                }
                if (rc == -2) {
                    PyErr_NoMemory();
                    return ROW_ERROR;
                }
                bit_set(c->valid, i);
            }
            break;
        }
        }
    }
    if (r->pos != r->len) {
        PyOS_snprintf(r->msg, sizeof r->msg, "%zd bytes left after the Avro value", r->len - r->pos);
        *kind = BAD_TRAILING;
        return ROW_BAD;
    }
    if (conversion) {
        memcpy(r->msg, conversion_msg, sizeof r->msg);
        *kind = BAD_CONVERSION;
        return ROW_BAD;
    }
    return ROW_OK;
bad:
    *kind = BAD_DECODE;
    return ROW_BAD;
}

/* A bad row: every column null (and empty) again at row i. */
static void reset_row(const Program *p, Column *cols, Py_ssize_t i) {
    for (uint32_t k = 0; k < p->ncols; k++) {
        Column *c = &cols[k];
        bit_clear(c->valid, i);
        switch (c->kind) {
        case COL_BOOL: bit_clear(c->vals, i); break;
        case COL_I32: case COL_F32: memset(c->vals + 4 * i, 0, 4); break;
        case COL_I64: case COL_F64: memset(c->vals + 8 * i, 0, 8); break;
        case COL_BIN: {
            int32_t off;
            memcpy(&off, c->vals + 4 * i, 4);
            c->data_len = (size_t)off;
            break;
        }
        }
    }
}

/* ------------------------------------------------------------------ decode */

PyDoc_STRVAR(decode_doc,
"decode(program, values, header) -> (row_validity, row_nulls, columns, bad, others)\n\n"
"Decode the Avro bodies of ``values`` (a list of bytes or None) that start with\n"
"``header`` (the 5-byte Confluent prefix of one schema id) into the program's\n"
"columns. A None value is a null row. A value that does not start with\n"
"``header`` is a null row too and its index is in ``others`` (the caller decodes\n"
"it another way). A value that does not decode is a null row and\n"
"(index, kind, message) in ``bad``: kind 1 a decode error, 2 trailing bytes,\n"
"3 an int too large for its 32-bit column.\n"
"columns: per program column, (validity, null_count, values, data): bytes in\n"
"Arrow's layout (data None except for strings and binaries, whose values are\n"
"the int32 offsets). Raises OverflowError past 2 GiB of one column's data.");

static PyObject *decode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer prog, header;
    PyObject *values;
    if (!PyArg_ParseTuple(args, "y*O!y*:decode", &prog, &PyList_Type, &values, &header))
        return NULL;
    Program p;
    PyObject *result = NULL, *bad = NULL, *others = NULL, *row_valid = NULL, *columns = NULL;
    Column *cols = NULL;
    if (program_load(&p, prog.buf, prog.len) < 0) {
        PyBuffer_Release(&prog);
        PyBuffer_Release(&header);
        return NULL;
    }
    const Py_ssize_t n = PyList_GET_SIZE(values);
    const Py_ssize_t nbits = (n + 7) / 8;
    cols = PyMem_Calloc(p.ncols ? p.ncols : 1, sizeof(Column));
    bad = PyList_New(0);
    others = PyList_New(0);
    row_valid = PyBytes_FromStringAndSize(NULL, nbits);
    if (cols == NULL || bad == NULL || others == NULL || row_valid == NULL) {
        if (cols == NULL)
            PyErr_NoMemory();
        goto done;
    }
    uint8_t *rows = (uint8_t *)PyBytes_AS_STRING(row_valid);
    memset(rows, 0, (size_t)nbits);
    for (uint32_t k = 0; k < p.ncols; k++) {
        Column *c = &cols[k];
        c->kind = p.kinds[k];
        Py_ssize_t width;
        switch (c->kind) {
        case COL_BOOL: width = nbits; break;
        case COL_I32: case COL_F32: width = 4 * n; break;
        case COL_BIN: width = 4 * (n + 1); break;
        default: width = 8 * n; break;
        }
        c->valid_obj = PyBytes_FromStringAndSize(NULL, nbits);
        c->vals_obj = PyBytes_FromStringAndSize(NULL, width);
        if (c->valid_obj == NULL || c->vals_obj == NULL)
            goto done;
        c->valid = (uint8_t *)PyBytes_AS_STRING(c->valid_obj);
        c->vals = (uint8_t *)PyBytes_AS_STRING(c->vals_obj);
        memset(c->valid, 0, (size_t)nbits);
        memset(c->vals, 0, (size_t)width);
    }
    const uint8_t *hdr = header.buf;
    const Py_ssize_t hlen = header.len;
    Reader r;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(values, i);
        if (item != Py_None) {
            if (!PyBytes_Check(item) || PyBytes_GET_SIZE(item) < hlen ||
                memcmp(PyBytes_AS_STRING(item), hdr, (size_t)hlen) != 0) {
                PyObject *index = PyLong_FromSsize_t(i);
                if (index == NULL || PyList_Append(others, index) < 0) {
                    Py_XDECREF(index);
                    goto done;
                }
                Py_DECREF(index);
            } else {
                r.v = (const uint8_t *)PyBytes_AS_STRING(item);
                r.len = PyBytes_GET_SIZE(item);
                r.pos = hlen;
                r.msg[0] = 0;
                int kind = 0;
                int rc = decode_row(&p, cols, &r, i, &kind);
                if (rc == ROW_ERROR)
                    goto done;
                if (rc == ROW_OK) {
                    bit_set(rows, i);
                } else {
                    reset_row(&p, cols, i);
                    PyObject *entry = Py_BuildValue("(nis)", i, kind, r.msg);
                    if (entry == NULL || PyList_Append(bad, entry) < 0) {
                        Py_XDECREF(entry);
                        goto done;
                    }
                    Py_DECREF(entry);
                }
            }
        }
        for (uint32_t k = 0; k < p.ncols; k++) {  /* the row's end offset in every binary column */
            Column *c = &cols[k];
            if (c->kind == COL_BIN) {
                int32_t off = (int32_t)c->data_len;
                memcpy(c->vals + 4 * (i + 1), &off, 4);
            }
        }
    }
    columns = PyList_New(p.ncols);
    if (columns == NULL)
        goto done;
    for (uint32_t k = 0; k < p.ncols; k++) {
        Column *c = &cols[k];
        PyObject *data = Py_None;
        if (c->kind == COL_BIN) {
            data = PyBytes_FromStringAndSize(c->data ? c->data : "", (Py_ssize_t)c->data_len);
            if (data == NULL)
                goto done;
        } else {
            Py_INCREF(data);
        }
        Py_ssize_t nulls = n - popcount(c->valid, nbits);
        PyObject *t = Py_BuildValue("(OnON)", c->valid_obj, nulls, c->vals_obj, data);
        if (t == NULL)
            goto done;
        PyList_SET_ITEM(columns, k, t);
    }
    result = Py_BuildValue("(OnOOO)", row_valid, n - popcount(rows, nbits), columns, bad, others);
done:
    if (cols != NULL) {
        for (uint32_t k = 0; k < p.ncols; k++) {
            Py_XDECREF(cols[k].valid_obj);
            Py_XDECREF(cols[k].vals_obj);
            PyMem_Free(cols[k].data);
        }
        PyMem_Free(cols);
    }
    Py_XDECREF(columns);
    Py_XDECREF(bad);
    Py_XDECREF(others);
    Py_XDECREF(row_valid);
    program_free(&p);
    PyBuffer_Release(&prog);
    PyBuffer_Release(&header);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "spark_jobs._avro_columns", "Flat Avro records to Arrow column buffers (C).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__avro_columns(void) {
    return PyModule_Create(&module);
}
