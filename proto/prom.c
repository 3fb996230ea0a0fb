/*
 * prom.c — the Prometheus text exposition format (prom.h): one writer, so
 * that every family's HELP, TYPE, labels and escapes come out the same way
 * whichever module exposes it.
 *
 * Escapes follow the format's 0.0.4 text: in label values backslash,
 * double quote and newline; in HELP backslash and newline. Nothing else is
 * escaped, since a scraper reads any other byte of a label value as it is.
 */
#include "prom.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* s with each byte of special as its two-character escape. */
static void put_escaped(attn_sbuf *b, const char *s, const char *special) {
  while (*s) {
    size_t k = strcspn(s, special);
    attn_sbuf_put(b, s, k);
    s += k;
    if (!*s)
      break;
    attn_sbuf_put(b, *s == '\n' ? "\\n" : *s == '"' ? "\\\"" : "\\\\", 2);
    s++;
  }
}

void attn_prom_family(attn_sbuf *b, const char *name, const char *type, const char *help) {
  attn_sbuf_printf(b, "# HELP %s ", name);
  put_escaped(b, help, "\\\n");
  attn_sbuf_printf(b, "\n# TYPE %s %s\n", name, type);
}

/* name and suffix, then the labels and le (when not NULL) in braces, then
 * the space before the value. */
static void series(attn_sbuf *b, const char *name, const char *suffix, const attn_prom_label *l,
                   int n, const char *le) {
  attn_sbuf_puts(b, name);
  attn_sbuf_puts(b, suffix);
  if (n > 0 || le) {
    attn_sbuf_puts(b, "{");
    for (int i = 0; i < n; i++) {
      attn_sbuf_printf(b, "%s%s=\"", i ? "," : "", l[i].name);
      put_escaped(b, l[i].value, "\\\"\n");
      attn_sbuf_puts(b, "\"");
    }
    if (le)
      attn_sbuf_printf(b, "%sle=\"%s\"", n > 0 ? "," : "", le);
    attn_sbuf_puts(b, "}");
  }
  attn_sbuf_puts(b, " ");
}

/* Shortest form that reads back as the same double, so sums survive the
 * trip through the scraper exactly without printing 17 noisy digits. */
static void put_f64(attn_sbuf *b, double v) {
  if (isnan(v)) {
    attn_sbuf_puts(b, "NaN\n");
    return;
  }
  if (isinf(v)) {
    attn_sbuf_puts(b, v > 0 ? "+Inf\n" : "-Inf\n");
    return;
  }
  char tmp[32];
  snprintf(tmp, sizeof tmp, "%.15g", v);
  if (strtod(tmp, NULL) != v)
    snprintf(tmp, sizeof tmp, "%.17g", v);
  attn_sbuf_printf(b, "%s\n", tmp);
}

void attn_prom_sample_u64(attn_sbuf *b, const char *name, const attn_prom_label *l, int n,
                          uint64_t v) {
  series(b, name, "", l, n, NULL);
  attn_sbuf_printf(b, "%" PRIu64 "\n", v);
}

void attn_prom_sample_i64(attn_sbuf *b, const char *name, const attn_prom_label *l, int n,
                          int64_t v) {
  series(b, name, "", l, n, NULL);
  attn_sbuf_printf(b, "%" PRId64 "\n", v);
}

void attn_prom_sample_f64(attn_sbuf *b, const char *name, const attn_prom_label *l, int n,
                          double v) {
  series(b, name, "", l, n, NULL);
  put_f64(b, v);
}

void attn_prom_counter(attn_sbuf *b, const char *name, const char *help, uint64_t v) {
  attn_prom_family(b, name, "counter", help);
  attn_prom_sample_u64(b, name, NULL, 0, v);
}

void attn_prom_gauge(attn_sbuf *b, const char *name, const char *help, int64_t v) {
  attn_prom_family(b, name, "gauge", help);
  attn_prom_sample_i64(b, name, NULL, 0, v);
}

void attn_prom_histogram(attn_sbuf *b, const char *name, const attn_prom_label *l, int n,
                         const attn_prom_hist *h) {
  uint64_t cum = 0;
  for (int i = 0; i <= h->nbounds; i++) {
    cum += h->counts[i];
    series(b, name, "_bucket", l, n, i < h->nbounds ? h->les[i] : "+Inf");
    attn_sbuf_printf(b, "%" PRIu64 "\n", cum);
  }
  series(b, name, "_sum", l, n, NULL);
  put_f64(b, h->sum);
  series(b, name, "_count", l, n, NULL);
  attn_sbuf_printf(b, "%" PRIu64 "\n", cum);
}
