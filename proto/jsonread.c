/*
 * jsonread.c — a JSON reader that works in place over the body, for the
 * JSON codec (json.c).
 *
 * A request body can hold millions of numbers. A tree parser such as cJSON
 * spends a node (about 64 bytes) on each before the codec sees one, so a
 * 30 MB body cost over a gigabyte. Here nothing is allocated: the decoder
 * walks the body with a cursor and converts each number straight into its
 * tensor's buffer.
 *
 * Reading happens in two steps. attn__json_check() first checks the whole
 * body against the JSON grammar (RFC 8259: strict numbers, escapes, UTF-8,
 * no control bytes in strings, nothing after the value), so that a body that
 * is not JSON is always refused as such, whatever else is wrong with it, and
 * with the byte offset where it goes wrong. The cursor functions then rely
 * on that check: they never meet a malformed token, and every value they
 * read ends inside the body (the body is an object, so a closing brace
 * follows every number, which is what lets strtod() read in place).
 */
#include "internal.h"
#include "proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* ---- the grammar check ---------------------------------------------------- */

typedef struct chk {
  const char *s;
  size_t len, pos;
  attn_status *st;
} chk;

/* The error at c->pos; past the end, the body is cut short. */
static int bad(chk *c, const char *why) {
  if (c->pos >= c->len)
    return attn_status_set(c->st, ATTN_PROTO_EJSON,
                           "invalid JSON at byte %zu (the body ends early)", c->len);
  return attn_status_set(c->st, ATTN_PROTO_EJSON, "invalid JSON at byte %zu: %s", c->pos, why);
}

static void chk_ws(chk *c) {
  while (c->pos < c->len && is_ws(c->s[c->pos]))
    c->pos++;
}

/* Four hex digits at c->pos into *cp. */
static int hex4(chk *c, unsigned *cp) {
  *cp = 0;
  for (int i = 0; i < 4; i++, c->pos++) {
    if (c->pos >= c->len)
      return bad(c, NULL);
    char h = c->s[c->pos];
    unsigned d = is_digit(h)                              ? (unsigned)(h - '0')
                 : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (unsigned)((h | 0x20) - 'a' + 10)
                                                          : 16u;
    if (d == 16)
      return bad(c, "\\u needs four hex digits");
    *cp = *cp << 4 | d;
  }
  return 0;
}

/* One escape at c->pos (the backslash). A \u escape of a UTF-16 surrogate
 * must be a high one followed by a low one: anything else names no
 * character. */
static int check_escape(chk *c) {
  size_t at = c->pos++;
  if (c->pos >= c->len)
    return bad(c, NULL);
  char e = c->s[c->pos];
  if (e != 'u') {
    if (!e || !strchr("\"\\/bfnrt", e))
      return bad(c, "unknown escape (use \\\" \\\\ \\/ \\b \\f \\n \\r \\t or \\uXXXX)");
    c->pos++;
    return 0;
  }
  c->pos++;
  unsigned cp;
  int rc = hex4(c, &cp);
  if (rc < 0 || cp < 0xd800 || cp > 0xdfff)
    return rc;
  if (cp <= 0xdbff) {
    if (c->pos + 1 >= c->len) {
      c->pos = c->len; /* cut short where the low half belongs */
      return bad(c, NULL);
    }
    if (c->s[c->pos] == '\\' && c->s[c->pos + 1] == 'u') {
      c->pos += 2;
      if ((rc = hex4(c, &cp)) < 0 || (cp >= 0xdc00 && cp <= 0xdfff))
        return rc;
    }
  }
  c->pos = at;
  return bad(c, "a \\u escape of half a UTF-16 surrogate pair");
}

static int check_string(chk *c) {
  c->pos++; /* the opening quote */
  while (c->pos < c->len) {
    unsigned char ch = (unsigned char)c->s[c->pos];
    if (ch == '"') {
      c->pos++;
      return 0;
    }
    if (ch == '\\') {
      int rc = check_escape(c);
      if (rc < 0)
        return rc;
    } else if (ch < 0x20) {
      return bad(c, "a control byte in a string (write it as an escape such as \\n)");
    } else if (ch >= 0x80) {
      size_t k = attn__utf8_len((const unsigned char *)c->s + c->pos, c->len - c->pos);
      if (!k)
        return bad(c, "invalid UTF-8 in a string");
      c->pos += k;
    } else {
      c->pos++;
    }
  }
  return bad(c, NULL);
}

/* Skips the digits at c->pos; false (c->pos at the offender) when none. */
static bool digits(chk *c) {
  size_t start = c->pos;
  while (c->pos < c->len && is_digit(c->s[c->pos]))
    c->pos++;
  return c->pos > start;
}

/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? : JSON's numbers only, so
 * strtod() later reads exactly this text (no hex, inf, nan or "1."). */
static int check_number(chk *c) {
  static const char *const why = "invalid number (JSON numbers look like -1.25e-3)";
  if (c->s[c->pos] == '-')
    c->pos++;
  if (c->pos < c->len && c->s[c->pos] == '0')
    c->pos++;
  else if (!digits(c))
    return bad(c, why);
  if (c->pos < c->len && c->s[c->pos] == '.') {
    c->pos++;
    if (!digits(c))
      return bad(c, why);
  }
  if (c->pos < c->len && (c->s[c->pos] == 'e' || c->s[c->pos] == 'E')) {
    c->pos++;
    if (c->pos < c->len && (c->s[c->pos] == '+' || c->s[c->pos] == '-'))
      c->pos++;
    if (!digits(c))
      return bad(c, why);
  }
  return 0;
}

static int check_literal(chk *c, const char *word) {
  for (; *word; word++, c->pos++)
    if (c->pos >= c->len || c->s[c->pos] != *word)
      return bad(c, "expected a value (an object, array, string, number, true, false or "
                    "null)");
  return 0;
}

static int check_value(chk *c, int depth);

/* An object or array at c->pos. */
static int check_container(chk *c, int depth) {
  /* The codecs' pre-scans refuse deeper bodies first; this keeps the
   * recursion bounded on its own. */
  if (depth > ATTN__JSON_MAX_DEPTH)
    return bad(c, "nesting too deep");
  bool obj = c->s[c->pos] == '{';
  char close = obj ? '}' : ']';
  c->pos++;
  chk_ws(c);
  if (c->pos < c->len && c->s[c->pos] == close) {
    c->pos++;
    return 0;
  }
  for (;;) {
    int rc;
    if (obj) {
      chk_ws(c);
      if (c->pos >= c->len || c->s[c->pos] != '"')
        return bad(c, "expected a key (a string in double quotes)");
      if ((rc = check_string(c)) < 0)
        return rc;
      chk_ws(c);
      if (c->pos >= c->len || c->s[c->pos] != ':')
        return bad(c, "expected ':' after the key");
      c->pos++;
    }
    if ((rc = check_value(c, depth)) < 0)
      return rc;
    chk_ws(c);
    if (c->pos < c->len && c->s[c->pos] == ',') {
      c->pos++;
    } else if (c->pos < c->len && c->s[c->pos] == close) {
      c->pos++;
      return 0;
    } else {
      return bad(c, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
  }
}

static int check_value(chk *c, int depth) {
  chk_ws(c);
  if (c->pos >= c->len)
    return bad(c, NULL);
  switch (c->s[c->pos]) {
  case '{':
  case '[': return check_container(c, depth + 1);
  case '"': return check_string(c);
  case 't': return check_literal(c, "true");
  case 'f': return check_literal(c, "false");
  case 'n': return check_literal(c, "null");
  default:
    if (c->s[c->pos] == '-' || is_digit(c->s[c->pos]))
      return check_number(c);
    return bad(c, "expected a value (an object, array, string, number, true, false or null)");
  }
}

int attn__json_check(const char *s, size_t len, attn_status *st) {
  chk c = {s, len, 0, st};
  int rc = check_value(&c, 0);
  if (rc < 0)
    return rc;
  chk_ws(&c);
  if (c.pos < len)
    return attn_status_set(st, ATTN_PROTO_EJSON,
                           "invalid JSON at byte %zu: trailing characters after the value", c.pos);
  return 0;
}

/* ---- the cursor (checked text only) ------------------------------------ */

void attn__jr_ws(attn__jr *j) {
  while (j->pos < j->len && is_ws(j->s[j->pos]))
    j->pos++;
}

static void skip_string(attn__jr *j) {
  j->pos++;
  while (j->s[j->pos] != '"')
    j->pos += j->s[j->pos] == '\\' ? 2 : 1;
  j->pos++;
}

void attn__jr_skip(attn__jr *j) {
  char c = j->s[j->pos];
  if (c == '"') {
    skip_string(j);
  } else if (c == '{' || c == '[') {
    int depth = 0;
    do {
      c = j->s[j->pos];
      if (c == '"') {
        skip_string(j);
        continue;
      }
      depth += c == '{' || c == '[' ? 1 : c == '}' || c == ']' ? -1 : 0;
      j->pos++;
    } while (depth > 0);
  } else { /* a number or literal: up to the next delimiter */
    while (j->pos < j->len && !strchr(",]} \t\n\r", j->s[j->pos]))
      j->pos++;
  }
}

const char *attn__jr_type(const attn__jr *j) {
  switch (j->s[j->pos]) {
  case '{': return "an object";
  case '[': return "an array";
  case '"': return "a string";
  case 't':
  case 'f': return "a boolean";
  case 'n': return "null";
  default: return "a number";
  }
}

bool attn__jr_is_number(const attn__jr *j) { return j->s[j->pos] == '-' || is_digit(j->s[j->pos]); }

double attn__jr_number(attn__jr *j) {
  char *end;
  double x = attn__parse_number(j->s + j->pos, &end);
  j->pos = (size_t)(end - j->s);
  return x;
}

/* Steps over the '{' or '[' opening a container, or the ',' after one of
 * its items; false (past the container) at its end. */
static bool next_item(attn__jr *j, char close) {
  attn__jr_ws(j);
  char c = j->s[j->pos];
  if (c != close) {
    if (c == ',' || c == '{' || c == '[')
      j->pos++;
    attn__jr_ws(j);
  }
  if (j->s[j->pos] == close) {
    j->pos++;
    return false;
  }
  return true;
}

bool attn__jr_elem(attn__jr *j) { return next_item(j, ']'); }

bool attn__jr_member(attn__jr *j, char *key, size_t cap, size_t *klen) {
  if (!next_item(j, '}'))
    return false;
  *klen = attn__jr_string(j, key, cap);
  attn__jr_ws(j);
  j->pos++; /* ':' */
  attn__jr_ws(j);
  return true;
}

bool attn__seen_first(attn__seen *s, const char *key, size_t klen) {
  for (int i = 0; i < s->n; i++)
    if (s->len[i] == klen && !memcmp(s->key[i], key, klen))
      return false;
  if (klen < ATTN__SEEN_KEY && s->n < ATTN__SEEN_MAX) {
    memcpy(s->key[s->n], key, klen);
    s->len[s->n++] = (unsigned char)klen;
  }
  return true;
}

bool attn__key_is(const char *key, size_t klen, const char *want) {
  return klen == strlen(want) && !memcmp(key, want, klen);
}

const char *attn__key_quote(char *dst, size_t cap, const char *key, size_t klen, size_t kcap) {
  return attn_quote(dst, cap, key, klen < kcap ? klen : kcap - 1);
}

size_t attn__jr_count(const attn__jr *j) {
  attn__jr c = *j;
  size_t n = 0;
  for (; attn__jr_elem(&c); n++)
    attn__jr_skip(&c);
  return n;
}

/* The code point of the checked \uXXXX at s (after the backslash). */
static unsigned hex_at(const char *s) {
  unsigned cp = 0;
  for (int i = 1; i <= 4; i++)
    cp = cp << 4 | (unsigned)(is_digit(s[i]) ? s[i] - '0' : (s[i] | 0x20) - 'a' + 10);
  return cp;
}

/* The escape at j->pos (the backslash) as UTF-8 into out; returns its
 * length. */
static size_t unescape(attn__jr *j, char out[4]) {
  char e = j->s[j->pos + 1];
  j->pos += 2;
  if (e != 'u') {
    static const char from[] = "bfnrt", to[] = "\b\f\n\r\t";
    const char *p = strchr(from, e);
    out[0] = p ? to[p - from] : e;
    return 1;
  }
  unsigned cp = hex_at(j->s + j->pos - 1);
  j->pos += 4;
  if (cp >= 0xd800 && cp <= 0xdbff) { /* checked: a low half follows */
    cp = 0x10000 + ((cp - 0xd800) << 10) + (hex_at(j->s + j->pos + 1) - 0xdc00);
    j->pos += 6;
  }
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xc0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  size_t n = cp < 0x10000 ? 3 : 4;
  out[0] = (char)(n == 3 ? 0xe0 | cp >> 12 : 0xf0 | cp >> 18);
  for (size_t i = 1; i < n; i++)
    out[i] = (char)(0x80 | ((cp >> (6 * (n - 1 - i))) & 0x3f));
  return n;
}

size_t attn__jr_string(attn__jr *j, char *buf, size_t cap) {
  size_t n = 0;
  j->pos++;
  while (j->s[j->pos] != '"') {
    char one[4];
    size_t k = 1;
    if (j->s[j->pos] == '\\')
      k = unescape(j, one);
    else
      one[0] = j->s[j->pos++];
    for (size_t i = 0; i < k; i++, n++)
      if (n + 1 < cap)
        buf[n] = one[i];
  }
  j->pos++;
  buf[n + 1 < cap ? n : cap - 1] = 0;
  return n;
}
