/*
 * Python-strict UTF-8 validation, shared by the C extensions that check Avro
 * strings (broker/_gate.c, spark_jobs/_avro_columns.c): both must refuse exactly
 * what Python's decoder (and so fastavro) refuses.
 */
#ifndef ICEFALL_UTF8_H
#define ICEFALL_UTF8_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Python-strict UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF):
 * the offset of the first bad byte, or -1. */
static Py_ssize_t utf8_invalid_at(const uint8_t *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        while (i + 16 <= n) {  /* ASCII runs, 16 bytes at a time */
            uint64_t w1, w2;
            memcpy(&w1, s + i, 8);
            memcpy(&w2, s + i + 8, 8);
            if ((w1 | w2) & 0x8080808080808080ULL)
                break;
            i += 16;
        }
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        if (i >= n)
            break;
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80)
                return i;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n)
                return i;
            uint8_t c1 = s[i + 1], c2 = s[i + 2];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80)
                return i;
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F))
                return i;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n)
                return i;
            uint8_t c1 = s[i + 1], c2 = s[i + 2], c3 = s[i + 3];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80 || (c3 & 0xC0) != 0x80)
                return i;
            if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F))
                return i;
            i += 4;
        } else {
            return i;
        }
    }
    return -1;
}

#endif /* ICEFALL_UTF8_H */
