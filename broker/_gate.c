/* broker._gate: the data quality gate's hot loop in C.
 *
 * check_values() walks the records of one decompressed Kafka v2 record batch
 * body and checks every non-null value: Confluent wire format (magic 0 +
 * 4-byte big-endian schema id), a known schema id, and an Avro body that
 * decodes with that schema's validator program (compiled by
 * broker/avro_program.py) consuming exactly the value's bytes.
 *
 * Everything is bounds-checked: any bytes (and any program bytes) give an
 * answer or a Python exception, never a crash. Nesting is limited to MAX_DEPTH.
 *
 * Program layout (all integers little-endian):
 *   "AVP1" | u32 nfuncs | u32 offset[nfuncs] | code
 * Function 0 is the entry; a function runs until RET. Opcodes: see OP_* below
 * and broker/avro_program.py, which must agree.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include "_utf8.h"

#define MAX_DEPTH 500
#define MAX_ZERO_WIDTH_ITEMS 1000000
#define DECIMAL_DEFER_BYTES 1024
#define NO_FUNC 0xFFFFFFFFu

enum {
    OP_RET = 0,
    OP_BOOLEAN = 1,
    OP_INT = 2,
    OP_LONG = 3,
    OP_FLOAT = 4,
    OP_DOUBLE = 5,
    OP_BYTES = 6,
    OP_STRING = 7,
    OP_FIXED = 8,        /* u32 size */
    OP_ENUM = 9,         /* u32 symbol count */
    OP_UNION = 10,       /* u32 n, u32 func[n] (NO_FUNC: null branch) */
    OP_ARRAY = 11,       /* u32 items func, u8 items are zero-width */
    OP_MAP = 12,         /* u32 values func (NO_FUNC: null values) */
    OP_CALL = 13,        /* u32 func */
    OP_INT_RANGE = 14,   /* i32 lo, i32 hi */
    OP_LONG_RANGE = 15,  /* i64 lo, i64 hi */
    OP_STRING_UUID = 16,
    OP_BYTES_DECIMAL = 17,
    OP_DEFER = 18,
    OP_ACCEPT_ALL = 19,
};

static PyObject *FramingError;

/* ------------------------------------------------------------------ the VM */

typedef struct {
    const uint8_t *v;     /* the bytes being validated */
    Py_ssize_t pos, len;  /* position in v, length of v */
    const uint8_t *code;
    Py_ssize_t code_len;
    const uint8_t *table;
    uint32_t nfuncs;
    int depth;
    int defer;            /* a logical value only fastavro can judge: check it in Python */
    int bad_program;      /* the program itself is malformed (a ValueError, not a verdict) */
    char msg[240];
} VM;

static inline uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline int64_t rd_i64(const uint8_t *p) {
    uint64_t lo = rd_u32(p), hi = rd_u32(p + 4);
    return (int64_t)(lo | (hi << 32));
}

static int vm_fail(VM *vm, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PyOS_vsnprintf(vm->msg, sizeof vm->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static int vm_bad_program(VM *vm, const char *what) {
    vm->bad_program = 1;
    return vm_fail(vm, "invalid validator program: %s", what);
}

/* An Avro zigzag varint of at most 10 bytes. *lost: bits beyond 64 were set. */
static inline int vm_varint(VM *vm, int64_t *out, int *lost, const char *what) {
    if (vm->pos < vm->len && vm->v[vm->pos] < 0x80) {  /* the common one-byte case */
        uint64_t one = vm->v[vm->pos++];
        *lost = 0;
        *out = (int64_t)((one >> 1) ^ (~(one & 1) + 1));
        return 0;
    }
    uint64_t raw = 0;
    int shift = 0;
    Py_ssize_t p = vm->pos;
    const Py_ssize_t start = p;
    *lost = 0;
    for (int i = 0;; i++) {
        if (p >= vm->len)
            return vm_fail(vm, "%s runs past the end at byte %zd", what, start);
        uint8_t b = vm->v[p++];
        raw |= (uint64_t)(b & 0x7F) << shift;
        if (i == 9 && (b & 0x7E))
            *lost = 1;
        if (!(b & 0x80))
            break;
        if (i == 9)
            return vm_fail(vm, "%s varint is longer than 10 bytes at byte %zd", what, start);
        shift += 7;
    }
    vm->pos = p;
    *out = (int64_t)((raw >> 1) ^ (~(raw & 1) + 1));
    return 0;
}

static inline int vm_long(VM *vm, int64_t *out, const char *what) {
    int lost;
    return vm_varint(vm, out, &lost, what);
}

static inline int vm_int(VM *vm, int64_t *out, const char *what) {
    int lost;
    Py_ssize_t start = vm->pos;
    if (vm_varint(vm, out, &lost, what) < 0)
        return -1;
    if (lost || *out < INT32_MIN || *out > INT32_MAX)
        return vm_fail(vm, "%s is outside the 32-bit int range at byte %zd", what, start);
    return 0;
}

/* A length-prefixed run (bytes, string, map key): its start and length. */
static inline int vm_span(VM *vm, Py_ssize_t *start, Py_ssize_t *n, const char *what) {
    int64_t len;
    Py_ssize_t at = vm->pos;
    if (vm_long(vm, &len, what) < 0)
        return -1;
    if (len < 0)
        return vm_fail(vm, "%s length %lld is negative at byte %zd", what, (long long)len, at);
    if (len > (int64_t)(vm->len - vm->pos))
        return vm_fail(vm, "%s length runs past the end at byte %zd", what, at);
    *start = vm->pos;
    *n = (Py_ssize_t)len;
    vm->pos += (Py_ssize_t)len;
    return 0;
}

static inline int vm_string(VM *vm, Py_ssize_t *start, Py_ssize_t *n, const char *what) {
    if (vm_span(vm, start, n, what) < 0)
        return -1;
    Py_ssize_t bad = utf8_invalid_at(vm->v + *start, *n);
    if (bad >= 0)
        return vm_fail(vm, "%s is not valid UTF-8 at byte %zd", what, *start + bad);
    return 0;
}

static int is_hex(uint8_t c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* The forms uuid.UUID() certainly accepts: 8-4-4-4-12 hex digits, or 32 hex digits. */
static int canonical_uuid(const uint8_t *s, Py_ssize_t n) {
    if (n == 32) {
        for (int i = 0; i < 32; i++)
            if (!is_hex(s[i]))
                return 0;
        return 1;
    }
    if (n != 36)
        return 0;
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-')
                return 0;
        } else if (!is_hex(s[i])) {
            return 0;
        }
    }
    return 1;
}

static int vm_run(VM *vm, uint32_t func);

static int vm_blocks(VM *vm, uint32_t func, int zero_width, int is_map) {
    const char *what = is_map ? "map block count" : "array block count";
    int64_t total = 0;
    for (;;) {
        int64_t count;
        Py_ssize_t at = vm->pos;
        if (vm_long(vm, &count, what) < 0)
            return -1;
        if (count == 0)
            return 0;
        if (count < 0) {
            int64_t size;
            if (count == INT64_MIN)
                return vm_fail(vm, "%s %lld is out of range at byte %zd", what, (long long)count, at);
            count = -count;
            if (vm_long(vm, &size, is_map ? "map block size" : "array block size") < 0)
                return -1;
        }
        if (zero_width && !is_map) {
            total += count;
            if (count > MAX_ZERO_WIDTH_ITEMS || total > MAX_ZERO_WIDTH_ITEMS)
                return vm_fail(vm, "array of more than %d zero-byte items at byte %zd", MAX_ZERO_WIDTH_ITEMS, at);
            continue;
        }
        /* every item (map entry: its key) takes at least one byte */
        if (count > (int64_t)(vm->len - vm->pos))
            return vm_fail(vm, "%s %lld exceeds the %zd bytes left at byte %zd", what, (long long)count,
                           vm->len - vm->pos, at);
        for (int64_t i = 0; i < count; i++) {
            if (is_map) {
                Py_ssize_t ks, kn;
                if (vm_string(vm, &ks, &kn, "map key") < 0)
                    return -1;
            }
            if (func != NO_FUNC && vm_run(vm, func) < 0)
                return -1;
        }
    }
}

static int vm_run(VM *vm, uint32_t func) {
    if (func >= vm->nfuncs)
        return vm_bad_program(vm, "function index out of range");
    if (vm->depth >= MAX_DEPTH)
        return vm_fail(vm, "value is nested deeper than %d levels at byte %zd", MAX_DEPTH, vm->pos);
    Py_ssize_t pc = rd_u32(vm->table + 4 * (Py_ssize_t)func);
    int result = -1;
    vm->depth++;
    for (;;) {
        if (pc >= vm->code_len) {
            vm_bad_program(vm, "code runs past the end");
            goto out;
        }
        uint8_t op = vm->code[pc++];
        int64_t x;
        Py_ssize_t s, n;
        switch (op) {
        case OP_RET:
            result = 0;
            goto out;
        case OP_BOOLEAN:
            if (vm->pos >= vm->len) {
                vm_fail(vm, "boolean runs past the end at byte %zd", vm->pos);
                goto out;
            }
            if (vm->v[vm->pos] > 1) {
                vm_fail(vm, "boolean byte is %d, not 0 or 1, at byte %zd", vm->v[vm->pos], vm->pos);
                goto out;
            }
            vm->pos++;
            break;
        case OP_INT:
            if (vm_int(vm, &x, "int") < 0)
                goto out;
            break;
        case OP_LONG:
            if (vm_long(vm, &x, "long") < 0)
                goto out;
            break;
        case OP_FLOAT:
        case OP_DOUBLE: {
            Py_ssize_t size = op == OP_FLOAT ? 4 : 8;
            if (vm->len - vm->pos < size) {
                vm_fail(vm, "%s runs past the end at byte %zd", op == OP_FLOAT ? "float" : "double", vm->pos);
                goto out;
            }
            vm->pos += size;
            break;
        }
        case OP_BYTES:
            if (vm_span(vm, &s, &n, "bytes") < 0)
                goto out;
            break;
        case OP_STRING:
            if (vm_string(vm, &s, &n, "string") < 0)
                goto out;
            break;
        case OP_FIXED: {
            if ((Py_ssize_t)4 > vm->code_len - pc) {
                vm_bad_program(vm, "operand past the end");
                goto out;
            }
            uint32_t size = rd_u32(vm->code + pc);
            pc += 4;
            if ((uint64_t)size > (uint64_t)(vm->len - vm->pos)) {
                vm_fail(vm, "fixed(%u) runs past the end at byte %zd", size, vm->pos);
                goto out;
            }
            vm->pos += size;
            break;
        }
        case OP_ENUM: {
            if ((Py_ssize_t)4 > vm->code_len - pc) {
                vm_bad_program(vm, "operand past the end");
                goto out;
            }
            uint32_t count = rd_u32(vm->code + pc);
            Py_ssize_t at = vm->pos;
            pc += 4;
            if (vm_long(vm, &x, "enum index") < 0)
                goto out;
            if (x < 0 || x >= (int64_t)count) {
                vm_fail(vm, "enum index %lld is outside [0, %u) at byte %zd", (long long)x, count, at);
                goto out;
            }
            break;
        }
        case OP_UNION: {
            if ((Py_ssize_t)4 > vm->code_len - pc) {
                vm_bad_program(vm, "operand past the end");
                goto out;
            }
            uint32_t count = rd_u32(vm->code + pc);
            Py_ssize_t at = vm->pos;
            pc += 4;
            if ((uint64_t)count * 4 > (uint64_t)(vm->code_len - pc)) {
                vm_bad_program(vm, "union table past the end");
                goto out;
            }
            Py_ssize_t table = pc;
            pc += (Py_ssize_t)count * 4;
            if (vm_long(vm, &x, "union index") < 0)
                goto out;
            if (x < 0 || x >= (int64_t)count) {
                vm_fail(vm, "union index %lld is outside [0, %u) at byte %zd", (long long)x, count, at);
                goto out;
            }
            uint32_t branch = rd_u32(vm->code + table + 4 * (Py_ssize_t)x);
            if (branch != NO_FUNC && vm_run(vm, branch) < 0)
                goto out;
            break;
        }
        case OP_ARRAY:
        case OP_MAP: {
            Py_ssize_t need = op == OP_ARRAY ? 5 : 4;
            if (need > vm->code_len - pc) {
                vm_bad_program(vm, "operand past the end");
                goto out;
            }
            uint32_t items = rd_u32(vm->code + pc);
            int zero_width = op == OP_ARRAY ? vm->code[pc + 4] : 0;
            pc += need;
            if (vm_blocks(vm, items, zero_width, op == OP_MAP) < 0)
                goto out;
            break;
        }
        case OP_CALL: {
            if ((Py_ssize_t)4 > vm->code_len - pc) {
                vm_bad_program(vm, "operand past the end");
                goto out;
            }
            uint32_t callee = rd_u32(vm->code + pc);
            pc += 4;
            if (vm_run(vm, callee) < 0)
                goto out;
            break;
        }
        case OP_INT_RANGE: {
            if ((Py_ssize_t)8 > vm->code_len - pc) {
                vm_bad_program(vm, "operand past the end");
                goto out;
            }
            int32_t lo = (int32_t)rd_u32(vm->code + pc), hi = (int32_t)rd_u32(vm->code + pc + 4);
            Py_ssize_t at = vm->pos;
            pc += 8;
            if (vm_int(vm, &x, "int") < 0)
                goto out;
            if (x < lo || x > hi) {
                vm_fail(vm, "logical value %lld is outside [%d, %d] at byte %zd", (long long)x, lo, hi, at);
                goto out;
            }
            break;
        }
        case OP_LONG_RANGE: {
            if ((Py_ssize_t)16 > vm->code_len - pc) {
                vm_bad_program(vm, "operand past the end");
                goto out;
            }
            int64_t lo = rd_i64(vm->code + pc), hi = rd_i64(vm->code + pc + 8);
            Py_ssize_t at = vm->pos;
            pc += 16;
            if (vm_long(vm, &x, "long") < 0)
                goto out;
            if (x < lo || x > hi) {
                vm_fail(vm, "logical value %lld is outside [%lld, %lld] at byte %zd", (long long)x, (long long)lo,
                        (long long)hi, at);
                goto out;
            }
            break;
        }
        case OP_STRING_UUID:
            if (vm_string(vm, &s, &n, "string") < 0)
                goto out;
            if (!canonical_uuid(vm->v + s, n))
                vm->defer = 1;
            break;
        case OP_BYTES_DECIMAL:
            if (vm_span(vm, &s, &n, "bytes") < 0)
                goto out;
            if (n > DECIMAL_DEFER_BYTES)
                vm->defer = 1;
            break;
        case OP_DEFER:
            vm->defer = 1;
            break;
        case OP_ACCEPT_ALL:
            vm->pos = vm->len;
            break;
        default:
            vm_bad_program(vm, "unknown opcode");
            goto out;
        }
    }
out:
    vm->depth--;
    return result;
}

/* A program's header into the VM; -1 with a ValueError set if malformed. */
static int vm_load(VM *vm, const uint8_t *prog, Py_ssize_t len) {
    if (len < 8 || memcmp(prog, "AVP1", 4) != 0) {
        PyErr_SetString(PyExc_ValueError, "invalid validator program: bad header");
        return -1;
    }
    uint32_t nfuncs = rd_u32(prog + 4);
    if (nfuncs == 0 || (uint64_t)nfuncs * 4 > (uint64_t)(len - 8)) {
        PyErr_SetString(PyExc_ValueError, "invalid validator program: bad function table");
        return -1;
    }
    vm->nfuncs = nfuncs;
    vm->table = prog + 8;
    vm->code = prog + 8 + 4 * (Py_ssize_t)nfuncs;
    vm->code_len = len - 8 - 4 * (Py_ssize_t)nfuncs;
    return 0;
}

/* Run the loaded program over v[pos:len]: 0 valid (vm->defer may be set), -1 invalid
 * (vm->msg), -2 malformed program (ValueError set). */
static int vm_validate(VM *vm, const uint8_t *v, Py_ssize_t pos, Py_ssize_t len) {
    vm->v = v;
    vm->pos = pos;
    vm->len = len;
    vm->depth = 0;
    vm->defer = 0;
    vm->bad_program = 0;
    vm->msg[0] = 0;
    if (vm_run(vm, 0) < 0) {
        if (vm->bad_program) {
            PyErr_SetString(PyExc_ValueError, vm->msg);
            return -2;
        }
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ Kafka record framing */

/* Mirrors broker.records._varint: up to 10 bytes, the value saturated to int64
 * when Python's arbitrary-precision result would not fit. */
static inline int kafka_varint(const uint8_t *b, Py_ssize_t size, Py_ssize_t *pos, int64_t *out,
                               const char **err) {
    uint64_t raw = 0;
    int lost = 0;
    Py_ssize_t p = *pos;
    for (int i = 0;; i++) {
        if (p >= size) {
            *err = "varint runs past the end of the record";
            return -1;
        }
        uint8_t byte = b[p++];
        raw |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (i == 9 && (byte & 0x7E))
            lost = 1;
        if (!(byte & 0x80))
            break;
        if (i == 9) {
            *err = "varint too long";
            return -1;
        }
    }
    *pos = p;
    if (lost)
        *out = (raw & 1) ? INT64_MIN : INT64_MAX;
    else
        *out = (int64_t)((raw >> 1) ^ (~(raw & 1) + 1));
    return 0;
}

/* A key/value/header field: its start and length, length -1 for null. */
static inline int kafka_field(const uint8_t *b, Py_ssize_t size, Py_ssize_t *pos, Py_ssize_t *start,
                              Py_ssize_t *len, const char **err) {
    int64_t n;
    if (kafka_varint(b, size, pos, &n, err) < 0)
        return -1;
    if (n < 0) {
        *start = *pos;
        *len = -1;
        return 0;
    }
    if (n > (int64_t)(size - *pos)) {
        *err = "record field runs past the end of the batch";
        return -1;
    }
    *start = *pos;
    *len = (Py_ssize_t)n;
    *pos += (Py_ssize_t)n;
    return 0;
}

/* ------------------------------------------------------------------ check_values */

static PyObject *value_problem(Py_ssize_t index, const char *fmt, ...) {
    char buf[400];
    va_list ap;
    va_start(ap, fmt);
    PyOS_vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return Py_BuildValue("(ns)", index, buf);
}

PyDoc_STRVAR(check_values_doc,
"check_values(body, record_count, programs, deferred=None) -> None | (index, message)\n\n"
"Check the values of one decompressed v2 record batch body. programs maps a\n"
"schema id to a validator program (bytes), or to None: that id's values are\n"
"appended to `deferred` as (index, start, end) for the caller to check. A\n"
"KeyError from programs means an unknown schema id. Returns the first bad\n"
"record's index within the batch and the problem; raises FramingError if the\n"
"records themselves are malformed (as broker.records.decode_batch would).");

static PyObject *check_values(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"body", "record_count", "programs", "deferred", NULL};
    Py_buffer body;
    Py_ssize_t count;
    PyObject *programs, *deferred = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*nO|O:check_values", kwlist, &body, &count, &programs,
                                     &deferred))
        return NULL;
    if (deferred != Py_None && !PyList_Check(deferred)) {
        PyBuffer_Release(&body);
        PyErr_SetString(PyExc_TypeError, "deferred must be a list or None");
        return NULL;
    }

    const uint8_t *b = body.buf;
    const Py_ssize_t size = body.len;
    Py_ssize_t pos = 0;
    const char *err = NULL;
    PyObject *bad = NULL;       /* (index, message) of the first bad value */
    PyObject *program = NULL;   /* the program for cached_id (a strong reference) */
    int64_t cached_id = -1;
    VM vm;

    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, ignored;
        if (kafka_varint(b, size, &pos, &length, &err) < 0)
            goto framing;
        if (length < 0 || length > (int64_t)(size - pos)) {
            err = "record length runs past the end of the batch";
            goto framing;
        }
        Py_ssize_t end = pos + (Py_ssize_t)length;
        pos += 1;  /* attributes */
        if (kafka_varint(b, size, &pos, &ignored, &err) < 0)  /* timestamp delta */
            goto framing;
        if (kafka_varint(b, size, &pos, &ignored, &err) < 0)  /* offset delta */
            goto framing;
        Py_ssize_t ks, kn, vs, vn;
        if (kafka_field(b, size, &pos, &ks, &kn, &err) < 0)
            goto framing;
        if (kafka_field(b, size, &pos, &vs, &vn, &err) < 0)
            goto framing;
        int64_t headers;
        if (kafka_varint(b, size, &pos, &headers, &err) < 0)
            goto framing;
        for (int64_t h = 0; h < headers; h++) {  /* each header takes >= 2 bytes: bounded by size */
            Py_ssize_t hs, hn;
            if (kafka_field(b, size, &pos, &hs, &hn, &err) < 0)
                goto framing;
            if (kafka_field(b, size, &pos, &hs, &hn, &err) < 0)
                goto framing;
        }
        if (pos != end) {
            err = "record fields do not add up to the record length";
            goto framing;
        }
        if (bad != NULL || vn < 0)
            continue;  /* after the first bad value only the framing is still checked */

        const uint8_t *v = b + vs;
        if (vn < 5 || v[0] != 0) {
            bad = value_problem(i, "lacks the Confluent wire format (magic byte 0 + 4-byte schema id)");
            if (bad == NULL)
                goto error;
            continue;
        }
        uint32_t schema_id = ((uint32_t)v[1] << 24) | ((uint32_t)v[2] << 16) | ((uint32_t)v[3] << 8) | v[4];
        if (program == NULL || (int64_t)schema_id != cached_id) {
            PyObject *key = PyLong_FromUnsignedLong(schema_id);
            if (key == NULL)
                goto error;
            PyObject *found = PyObject_GetItem(programs, key);
            Py_DECREF(key);
            if (found == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_KeyError))
                    goto error;
                PyErr_Clear();
                bad = value_problem(i, "names schema id %u, which the registry does not know", schema_id);
                if (bad == NULL)
                    goto error;
                continue;
            }
            if (found != Py_None && !PyBytes_Check(found)) {
                Py_DECREF(found);
                PyErr_Format(PyExc_TypeError, "the program for schema id %u is not bytes or None", schema_id);
                goto error;
            }
            if (found != Py_None && vm_load(&vm, (const uint8_t *)PyBytes_AS_STRING(found),
                                            PyBytes_GET_SIZE(found)) < 0) {
                Py_DECREF(found);
                goto error;
            }
            Py_XDECREF(program);
            program = found;
            cached_id = schema_id;
        }
        int defer = program == Py_None;
        if (!defer) {
            int r = vm_validate(&vm, v, 5, vn);
            if (r == -2)
                goto error;
            if (r == -1) {
                bad = value_problem(i, "does not decode with Avro schema id %u: %s", schema_id, vm.msg);
            } else if (vm.pos != vn) {
                bad = value_problem(i, "has %zd bytes left over after decoding with Avro schema id %u",
                                    vn - vm.pos, schema_id);
            }
            if (r == -1 || vm.pos != vn) {
                if (bad == NULL)
                    goto error;
                continue;
            }
            defer = vm.defer;
        }
        if (defer) {
            if (deferred == Py_None) {
                PyErr_Format(PyExc_TypeError, "schema id %u needs a deferred list", schema_id);
                goto error;
            }
            PyObject *item = Py_BuildValue("(nnn)", i, vs, vs + vn);
            if (item == NULL || PyList_Append(deferred, item) < 0) {
                Py_XDECREF(item);
                goto error;
            }
            Py_DECREF(item);
        }
    }
    Py_XDECREF(program);
    PyBuffer_Release(&body);
    if (bad != NULL)
        return bad;
    Py_RETURN_NONE;

framing:
    PyErr_SetString(FramingError, err);
error:
    Py_XDECREF(bad);
    Py_XDECREF(program);
    PyBuffer_Release(&body);
    return NULL;
}

/* ------------------------------------------------------------------ record framing (split_batches) */

/* A zigzag varint (at most 10 bytes, a signed 64-bit value) inside [*pos, end): 0, or -1 when it runs past. */
static int field_varint(const uint8_t *b, int64_t *pos, int64_t end, int64_t *out) {
    uint64_t raw = 0;
    int shift = 0;
    int64_t p = *pos;
    for (;;) {
        if (p >= end || shift > 63)
            return -1;
        uint8_t byte = b[p++];
        raw |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80))
            break;
        shift += 7;
    }
    *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    *pos = p;
    return 0;
}

/* What is wrong with the fields of record `index` in b[pos:end], or NULL (broker.records._record_problem). */
static PyObject *record_problem(const uint8_t *b, int64_t pos, int64_t end, Py_ssize_t index) {
    static const char *names[3] = {"timestamp delta", "offset delta", "key length"};
    int64_t fields[3];
    int64_t v;
    if (b[pos])  /* unused (0); kafka-python and aiokafka read it as a varint */
        return PyUnicode_FromFormat("record %zd: attributes %d (must be 0)", index, (int)b[pos]);
    pos += 1;
    for (int i = 0; i < 3; i++) {
        if (field_varint(b, &pos, end, &fields[i]) < 0)
            return PyUnicode_FromFormat("record %zd: %s runs past the record", index, names[i]);
    }
    if (fields[1] != index)
        return PyUnicode_FromFormat("record %zd: offset delta %lld, expected %zd", index, (long long)fields[1], index);
    if (fields[2] < -1 || fields[2] > end - pos)
        return PyUnicode_FromFormat("record %zd: key length %lld does not fit the record", index, (long long)fields[2]);
    pos += fields[2] > 0 ? fields[2] : 0;
    if (field_varint(b, &pos, end, &v) < 0)
        return PyUnicode_FromFormat("record %zd: value length runs past the record", index);
    if (v < -1 || v > end - pos)
        return PyUnicode_FromFormat("record %zd: value length %lld does not fit the record", index, (long long)v);
    pos += v > 0 ? v : 0;
    int64_t header_count;
    if (field_varint(b, &pos, end, &header_count) < 0)
        return PyUnicode_FromFormat("record %zd: header count runs past the record", index);
    if (header_count < 0 || header_count > end - pos)
        return PyUnicode_FromFormat("record %zd: header count %lld does not fit the record", index,
                                    (long long)header_count);
    for (int64_t h = 0; h < header_count; h++) {
        if (field_varint(b, &pos, end, &v) < 0 || v < 0 || v > end - pos)
            return PyUnicode_FromFormat("record %zd: a header key does not fit the record", index);
        if (utf8_invalid_at(b + pos, v) >= 0)  /* a Kafka String; kafka-python fails on anything else */
            return PyUnicode_FromFormat("record %zd: a header key is not UTF-8", index);
        pos += v;
        if (field_varint(b, &pos, end, &v) < 0 || v < -1 || v > end - pos)
            return PyUnicode_FromFormat("record %zd: a header value does not fit the record", index);
        pos += v > 0 ? v : 0;
    }
    if (pos != end)
        return PyUnicode_FromFormat("record %zd: %lld bytes left over after its fields", index, (long long)(end - pos));
    return NULL;
}

PyDoc_STRVAR(record_framing_problem_doc,
"record_framing_problem(body, count) -> None | str\n\n"
"broker.records.check_record_framing in C: the problem with the records of an\n"
"uncompressed batch body (length prefixes, then every record's fields), or None.");

static PyObject *record_framing_problem(PyObject *self, PyObject *args) {
    Py_buffer body;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*n:record_framing_problem", &body, &count))
        return NULL;
    const uint8_t *b = body.buf;
    const int64_t size = body.len;
    int64_t pos = 0;
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t raw = 0;
        int shift = 0;
        for (;;) {
            if (pos >= size) {
                result = PyUnicode_FromString("record length runs past the end of the batch");
                goto done;
            }
            uint8_t byte = b[pos++];
            raw |= (uint64_t)(byte & 0x7F) << shift;
            if (!(byte & 0x80))
                break;
            shift += 7;
            if (shift > 28) {
                result = PyUnicode_FromString("record length varint is too long");
                goto done;
            }
        }
        int64_t length = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);  /* raw < 2**35 */
        if (length < 6) {
            result = PyUnicode_FromFormat("record of %lld bytes is too short", (long long)length);
            goto done;
        }
        if (pos + length <= size) {
            result = record_problem(b, pos, pos + length, i);
            if (result != NULL)
                goto done;
            if (PyErr_Occurred())
                goto done;
        }
        pos += length;  /* once past the end the next round stops: no overflow */
    }
    if (pos != size) {
        result = PyUnicode_FromFormat("records take %lld bytes but the batch holds %lld", (long long)pos,
                                      (long long)size);
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&body);
    return result;
}

/* ------------------------------------------------------------------ validate (one Avro body) */

PyDoc_STRVAR(validate_doc,
"validate(program, data) -> (problem, deferred)\n\n"
"Run a validator program over one Avro body (no wire-format prefix). problem\n"
"is None when the whole of data decodes; deferred is True when a logical\n"
"value (a non-canonical uuid, a huge decimal...) still needs fastavro's word.");

static PyObject *validate(PyObject *self, PyObject *args) {
    Py_buffer prog, data;
    if (!PyArg_ParseTuple(args, "y*y*:validate", &prog, &data))
        return NULL;
    VM vm;
    PyObject *result = NULL;
    if (vm_load(&vm, prog.buf, prog.len) < 0)
        goto done;
    int r = vm_validate(&vm, data.buf, 0, data.len);
    if (r == -2)
        goto done;
    if (r == -1)
        result = Py_BuildValue("(sO)", vm.msg, Py_False);
    else if (vm.pos != data.len)
        result = Py_BuildValue("(NO)", PyUnicode_FromFormat("%zd bytes left over", data.len - vm.pos), Py_False);
    else
        result = Py_BuildValue("(OO)", Py_None, vm.defer ? Py_True : Py_False);
done:
    PyBuffer_Release(&prog);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"check_values", (PyCFunction)(void (*)(void))check_values, METH_VARARGS | METH_KEYWORDS, check_values_doc},
    {"record_framing_problem", record_framing_problem, METH_VARARGS, record_framing_problem_doc},
    {"validate", validate, METH_VARARGS, validate_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "broker._gate", "The data quality gate's record and Avro validator (C).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__gate(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    FramingError = PyErr_NewExceptionWithDoc("broker._gate.FramingError",
                                             "The records of a batch are malformed.", PyExc_ValueError, NULL);
    if (FramingError == NULL || PyModule_AddObjectRef(m, "FramingError", FramingError) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) < 0 ||
        PyModule_AddIntConstant(m, "MAX_ZERO_WIDTH_ITEMS", MAX_ZERO_WIDTH_ITEMS) < 0 ||
        PyModule_AddIntConstant(m, "DECIMAL_DEFER_BYTES", DECIMAL_DEFER_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
