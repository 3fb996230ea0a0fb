/*
 * options.c — the request options of docs/design.md, parsed in one place.
 *
 * Every source (the URL query string, safetensors __metadata__, JSON body
 * fields) ends in attn_options_set() with the option's text; JSON first
 * checks the value's JSON type against attn_option_kind_of(). A later source
 * overrides an earlier one through attn_options_merge(): the body wins over
 * the query string.
 */
#include "internal.h"
#include "proto.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct opt_def {
  const char *name;
  attn_option_kind kind;
  unsigned bit;
} opt_def;

static const opt_def defs[] = {
    {"causal", ATTN_OPTK_BOOL, ATTN_OPT_CAUSAL},
    {"scale", ATTN_OPTK_NUMBER, ATTN_OPT_SCALE},
    {"window_left", ATTN_OPTK_INT, ATTN_OPT_WINDOW_LEFT},
    {"window_right", ATTN_OPTK_INT, ATTN_OPT_WINDOW_RIGHT},
    {"stats", ATTN_OPTK_BOOL, ATTN_OPT_STATS},
    {"backend", ATTN_OPTK_STRING, ATTN_OPT_BACKEND},
    {"softcap", ATTN_OPTK_NUMBER, ATTN_OPT_SOFTCAP},
    {"diag_offset", ATTN_OPTK_INT, ATTN_OPT_DIAG_OFFSET},
};
#define NDEFS (sizeof defs / sizeof *defs)

static const char *const backends[] = {"auto", "cpu", "cuda", "reference"};

void attn_options_init(attn_options *o) {
  memset(o, 0, sizeof *o);
  o->scale = NAN;
  o->window_left = o->window_right = -1;
  o->diag_offset = ATTN_DIAG_AUTO;
  strcpy(o->backend, "auto");
}

static const opt_def *find(const char *name, size_t len) {
  for (size_t i = 0; i < NDEFS; i++)
    if (strlen(defs[i].name) == len && memcmp(defs[i].name, name, len) == 0)
      return &defs[i];
  return NULL;
}

bool attn__own_field(const attn_options *o, const char *name, size_t len) {
  return o->fields && o->fields->is_field(o->fields->ctx, name, len);
}

attn_option_kind attn_option_kind_of(const char *name, size_t len) {
  const opt_def *d = find(name, len);
  return d ? d->kind : ATTN_OPTK_NONE;
}

int attn_options_set(attn_options *o, const char *name, size_t name_len, const char *value,
                     size_t value_len, const char *source, attn_status *st) {
  char qn[48], qv[48], buf[64];
  if (attn__own_field(o, name, name_len))
    return o->fields->text(o->fields->ctx, name, name_len, value, value_len, source, st);
  const opt_def *d = find(name, name_len);
  attn_quote(qn, sizeof qn, name, name_len);
  if (!d)
    return attn_status_set(st, ATTN_PROTO_EOPTION,
                           "unknown option \"%s\" in the %s (options: causal, scale, "
                           "window_left, window_right, diag_offset, stats, backend, softcap)",
                           qn, source);
  attn_quote(qv, sizeof qv, value, value_len);
  /* a NUL would end the text early: "cpu\0x" must not read as "cpu" */
  if (value_len >= sizeof buf || memchr(value, 0, value_len))
    goto bad;
  memcpy(buf, value, value_len);
  buf[value_len] = 0;
  switch (d->kind) {
  case ATTN_OPTK_BOOL: {
    bool v;
    if (!strcmp(buf, "true") || !strcmp(buf, "1"))
      v = true;
    else if (!strcmp(buf, "false") || !strcmp(buf, "0"))
      v = false;
    else
      goto bad;
    if (d->bit == ATTN_OPT_CAUSAL)
      o->causal = v;
    else
      o->stats = v;
    break;
  }
  case ATTN_OPTK_NUMBER: {
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (!*buf || *end || errno || !isfinite(v) || (d->bit == ATTN_OPT_SOFTCAP && v < 0))
      goto bad;
    if (d->bit == ATTN_OPT_SOFTCAP)
      o->softcap = v;
    else
      o->scale = v;
    break;
  }
  case ATTN_OPTK_INT: {
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    bool diag = d->bit == ATTN_OPT_DIAG_OFFSET;
    if (!*buf || *end || errno || (diag ? v > ATTN_MAX_DIM || v < -ATTN_MAX_DIM : v < -1))
      goto bad;
    if (diag)
      o->diag_offset = v;
    else if (d->bit == ATTN_OPT_WINDOW_LEFT)
      o->window_left = v;
    else
      o->window_right = v;
    break;
  }
  default: {
    size_t i = 0;
    while (i < sizeof backends / sizeof *backends && strcmp(buf, backends[i]))
      i++;
    if (i == sizeof backends / sizeof *backends)
      goto bad;
    strcpy(o->backend, buf);
  }
  }
  o->set |= d->bit;
  return 0;
bad:;
  static const char *const expect[] = {"", "true or false", "a finite number",
                                       "an integer >= -1 (-1: unbounded)",
                                       "auto, cpu, cuda or reference"};
  return attn_status_set(
      st, ATTN_PROTO_EOPTVALUE, "option \"%s\" in the %s must be %s (got \"%s\")", qn, source,
      d->bit == ATTN_OPT_SOFTCAP       ? "a finite number >= 0 (0: off)"
      : d->bit == ATTN_OPT_DIAG_OFFSET ? "an integer from -2^40 to 2^40 (0: top-left causal)"
                                       : expect[d->kind],
      qv);
}

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Percent-decodes s[0..n) into dst (at most n bytes); '+' is a space. */
static size_t url_decode(char *dst, const char *s, size_t n) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '%' && i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
      dst[o++] = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
      i += 2;
    } else {
      dst[o++] = s[i] == '+' ? ' ' : s[i];
    }
  }
  return o;
}

int attn__query_each(const char *query, attn__query_fn fn, void *ctx, attn_status *st) {
  if (!query)
    return 0;
  const char *p = query;
  while (*p) {
    const char *amp = strchr(p, '&');
    size_t len = amp ? (size_t)(amp - p) : strlen(p);
    if (len) {
      const char *eq = memchr(p, '=', len);
      size_t nlen = eq ? (size_t)(eq - p) : len;
      size_t vlen = eq ? len - nlen - 1 : 0;
      char *name = malloc(nlen + 1), *value = malloc(vlen + 1);
      if (!name || !value) {
        free(name);
        free(value);
        return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory parsing the query");
      }
      size_t dn = url_decode(name, p, nlen), dv = url_decode(value, eq ? eq + 1 : p, vlen);
      name[dn] = value[dv] = 0;
      int rc = fn(ctx, name, dn, value, dv, eq != NULL, st);
      free(name);
      free(value);
      if (rc < 0)
        return rc;
    }
    p += len + (amp ? 1 : 0);
  }
  return 0;
}

static int set_from_query(void *ctx, const char *name, size_t nlen, const char *value, size_t vlen,
                          bool has_value, attn_status *st) {
  /* A bare flag ("?causal") means true, as curl users expect. */
  return has_value ? attn_options_set(ctx, name, nlen, value, vlen, "query string", st)
                   : attn_options_set(ctx, name, nlen, "true", 4, "query string", st);
}

int attn_options_parse_query(attn_options *o, const char *query, attn_status *st) {
  return attn__query_each(query, set_from_query, o, st);
}

void attn_options_merge(attn_options *base, const attn_options *over) {
  if (over->set & ATTN_OPT_CAUSAL)
    base->causal = over->causal;
  if (over->set & ATTN_OPT_SCALE)
    base->scale = over->scale;
  if (over->set & ATTN_OPT_WINDOW_LEFT)
    base->window_left = over->window_left;
  if (over->set & ATTN_OPT_WINDOW_RIGHT)
    base->window_right = over->window_right;
  if (over->set & ATTN_OPT_STATS)
    base->stats = over->stats;
  if (over->set & ATTN_OPT_SOFTCAP)
    base->softcap = over->softcap;
  if (over->set & ATTN_OPT_BACKEND)
    strcpy(base->backend, over->backend);
  if (over->set & ATTN_OPT_DIAG_OFFSET)
    base->diag_offset = over->diag_offset;
  base->set |= over->set;
}
