/* The client's half of the warm server's wire (sandbox/server/listen.py), the `sandbox`
 * launcher's (launcher.c, its one client, for verbs and hooks): one JSON object per
 * SOCK_SEQPACKET message each way, written and read here without a JSON library. */
#ifndef SANDBOX_SERVER_WIRE_H
#define SANDBOX_SERVER_WIRE_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* MAX_REQUEST, DEFAULT_SOCKET, TAKE_UP_S, REPORT_ANSWER_S, SANDBOX_SERVED:
 * sandbox/executor/wire.py's, in the header sandbox/executor/build.py builds every C program with */
#include SANDBOX_CONFIG

struct buf { char *p; size_t n, cap, max; }; /* (max: bytes it may grow to; 0: MAX_REQUEST) */

/* Grown by a copy, the old block blanked before it is freed (never realloc): a request holds
 * the caller's environment, and the launcher's heap is what the container's pid 1 and
 * exec's process start with (issue #29). */
static inline int put_max(struct buf *b, const char *s, size_t n, size_t max) {
    if (n > max || b->n > max - n) return -1;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        char *p = malloc(cap);
        if (!p) return -1;
        if (b->p) {
            memcpy(p, b->p, b->n);
            explicit_bzero(b->p, b->cap);
            free(b->p);
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static inline int put(struct buf *b, const char *s, size_t n) { return put_max(b, s, n, b->max ? b->max : MAX_REQUEST); }

/* The buffer blanked and freed (see put_max). */
static inline void buf_free(struct buf *b) {
    if (b->p) explicit_bzero(b->p, b->cap);
    free(b->p);
    b->p = NULL, b->n = b->cap = 0;
}

/* The length of the UTF-8 sequence at s[0] as Python's strict decoder takes it (no overlong
 * form, no surrogate, nothing past U+10FFFF; n bytes left), or 0 where none starts there. */
static inline size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t k = c < 0x80 ? 0 : c >= 0xc2 && c <= 0xdf ? 1 : (c & 0xf0) == 0xe0 ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : 9;
    if (k == 9 || k >= n) return 0;
    for (size_t j = 1; j <= k; j++)
        if ((s[j] & 0xc0) != 0x80) return 0;
    unsigned char d = k ? s[1] : 0;
    if ((c == 0xe0 && d < 0xa0) || (c == 0xed && d > 0x9f) || (c == 0xf0 && d < 0x90) || (c == 0xf4 && d > 0x8f))
        return 0;
    return k + 1;
}

/* s (n bytes) as a JSON string. A byte that starts no UTF-8 sequence is written as Python's
 * surrogateescape reads it back (\udcXX: os.fsencode gives the byte again), so that any
 * argument, path, variable or state goes to the server as it is, as it would to Python. */
static inline int json_string(struct buf *b, const char *s, size_t n) {
    char esc[8];
    if (put(b, "\"", 1)) return -1;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = utf8_seq((const unsigned char *)s + i, n - i);
        int r;
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c;
            r = put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            r = put(b, esc, 6);
        } else if (k == 0) {
            snprintf(esc, sizeof esc, "\\udc%02x", c);
            r = put(b, esc, 6);
            k = 1;
        } else {
            r = put(b, s + i, k);
        }
        if (r) return -1;
        i += k;
    }
    return put(b, "\"", 1);
}

/* Where the value of "key" begins in the server's flat reply (an int, or a string as sent). */
static inline const char *field(const char *reply, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(reply, pat);
    if (!p) return NULL;
    p += strlen(pat);
    while (*p == ' ' || *p == ':') p++;
    return p;
}

#endif
