/*
 * Kafka record batch v2 records -> the column lists of a RecordChunk.
 *
 * spark_jobs/segments.py walks batches in Python; the per-record loop (varints,
 * key/value slices, headers) was the commit round's largest cost once values
 * were decoded in C (spark_jobs/_avro_columns.c). This is the same loop, with
 * the same checks and messages as segments._decode_batch, which stays as the
 * fallback and the reference. Inputs are untrusted: every read is bounds-checked
 * and a malformed record raises ValueError("malformed record: ...") or
 * ValueError with segments' own message; the caller turns both into
 * CorruptBatchError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    const unsigned char *buf;
    Py_ssize_t pos;
    Py_ssize_t stop;
} Reader;

/* A zigzag varint of at most 10 bytes; 0 on success, -1 with an exception set. */
static int read_varint(Reader *r, int64_t *out) {
    uint64_t raw = 0;
    int shift = 0;
    for (;;) {
        if (r->pos >= r->stop) {
            PyErr_SetString(PyExc_ValueError, "malformed record: index out of range");
            return -1;
        }
        unsigned char byte = r->buf[r->pos++];
        raw |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 0;
        }
        shift += 7;
        if (shift > 63) {
            PyErr_SetString(PyExc_ValueError, "varint too long");
            return -1;
        }
    }
}

/* bytes of length n at the reader (None for n < 0); NULL with an exception set. */
static PyObject *read_bytes(Reader *r, int64_t n) {
    if (n < 0) {
        Py_RETURN_NONE;
    }
    if (n > r->stop - r->pos) {
        /* Python slicing past the end yields short bytes, then the length check fails */
        PyErr_SetString(PyExc_ValueError, "malformed record: field runs past the end of the batch");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize((const char *)r->buf + r->pos, (Py_ssize_t)n);
    r->pos += (Py_ssize_t)n;
    return out;
}

static PyObject *read_headers(Reader *r) {
    int64_t count;
    if (read_varint(r, &count) < 0) return NULL;
    if (count < 0 || count > r->stop - r->pos) {
        PyErr_SetString(PyExc_ValueError, "malformed record: bad header count");
        return NULL;
    }
    PyObject *out = PyTuple_New((Py_ssize_t)count);
    if (out == NULL) return NULL;
    for (int64_t i = 0; i < count; i++) {
        int64_t n;
        if (read_varint(r, &n) < 0) goto fail;
        if (n < 0) {
            PyErr_SetString(PyExc_ValueError, "record header with a null key");
            goto fail;
        }
        if (n > r->stop - r->pos) {
            PyErr_SetString(PyExc_ValueError, "malformed record: header runs past the end of the batch");
            goto fail;
        }
        PyObject *name = PyUnicode_DecodeUTF8((const char *)r->buf + r->pos, (Py_ssize_t)n, "replace");
        if (name == NULL) goto fail;
        r->pos += (Py_ssize_t)n;
        if (read_varint(r, &n) < 0) {
            Py_DECREF(name);
            goto fail;
        }
        PyObject *value = read_bytes(r, n);
        if (value == NULL) {
            Py_DECREF(name);
            goto fail;
        }
        PyObject *pair = PyTuple_Pack(2, name, value);
        Py_DECREF(name);
        Py_DECREF(value);
        if (pair == NULL) goto fail;
        PyTuple_SET_ITEM(out, (Py_ssize_t)i, pair);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static int append_steal(PyObject *list, PyObject *item) {
    if (item == NULL) return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

/*
 * decode_records(buf, pos, stop, record_count, base_offset, base_ts, append_time,
 *                lo, hi, offsets, timestamps, keys, values, headers, no_headers) -> None
 * append_time < 0: use each record's own timestamp.
 */
static PyObject *decode_records(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t pos, stop;
    long long record_count, base_offset, base_ts, append_time, lo, hi;
    PyObject *offsets, *timestamps, *keys, *values, *headers, *no_headers;
    if (!PyArg_ParseTuple(args, "y*nnLLLLLLO!O!O!O!O!O", &view, &pos, &stop, &record_count, &base_offset, &base_ts,
                          &append_time, &lo, &hi, &PyList_Type, &offsets, &PyList_Type, &timestamps, &PyList_Type,
                          &keys, &PyList_Type, &values, &PyList_Type, &headers, &no_headers)) {
        return NULL;
    }
    if (pos < 0 || stop > view.len || pos > stop) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "malformed record: bad batch bounds");
        return NULL;
    }
    Reader r = {(const unsigned char *)view.buf, pos, stop};
    char message[160];
    for (long long i = 0; i < record_count; i++) {
        int64_t length, ts_delta, offset_delta, n;
        if (read_varint(&r, &length) < 0) goto fail;
        Py_ssize_t rec_end = r.pos + (Py_ssize_t)length;
        if (length < 6 || length > stop - r.pos) {
            snprintf(message, sizeof message, "record of %lld bytes does not fit batch at offset %lld",
                     (long long)length, base_offset);
            PyErr_SetString(PyExc_ValueError, message);
            goto fail;
        }
        Reader rec = {r.buf, r.pos + 1, rec_end}; /* skip the attributes byte */
        if (read_varint(&rec, &ts_delta) < 0) goto fail;
        if (read_varint(&rec, &offset_delta) < 0) goto fail;
        long long offset = base_offset + offset_delta;
        if (offset < lo || offset >= hi) {
            r.pos = rec_end;
            continue;
        }
        if (read_varint(&rec, &n) < 0) goto fail;
        PyObject *key = read_bytes(&rec, n);
        if (key == NULL) goto fail;
        if (read_varint(&rec, &n) < 0) {
            Py_DECREF(key);
            goto fail;
        }
        PyObject *value = read_bytes(&rec, n);
        if (value == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        PyObject *record_headers;
        if (rec.pos < rec.stop && rec.buf[rec.pos] == 0) {
            rec.pos++;
            record_headers = no_headers;
            Py_INCREF(record_headers);
        } else {
            record_headers = read_headers(&rec);
        }
        if (record_headers == NULL || rec.pos != rec_end) {
            if (record_headers != NULL) {
                Py_DECREF(record_headers);
                snprintf(message, sizeof message, "record at offset %lld does not add up to its length", offset);
                PyErr_SetString(PyExc_ValueError, message);
            }
            Py_DECREF(key);
            Py_DECREF(value);
            goto fail;
        }
        if (append_steal(offsets, PyLong_FromLongLong(offset)) < 0 ||
            append_steal(timestamps, PyLong_FromLongLong(append_time < 0 ? base_ts + ts_delta : append_time)) < 0 ||
            append_steal(keys, key) < 0 || append_steal(values, value) < 0 ||
            append_steal(headers, record_headers) < 0) {
            goto fail;
        }
        r.pos = rec_end;
    }
    if (r.pos != stop) {
        snprintf(message, sizeof message, "batch at offset %lld has %lld bytes after its last record", base_offset,
                 (long long)(stop - r.pos));
        PyErr_SetString(PyExc_ValueError, message);
        goto fail;
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"decode_records", decode_records, METH_VARARGS, "Append a batch's records in [lo, hi) to column lists."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kafka_records", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kafka_records(void) { return PyModule_Create(&module); }
