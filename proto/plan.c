/*
 * plan.c — the memory plan on the wire: its parameters from a query string
 * (GET /attention/plan) and its JSON (the reply, and `attn plan --json`).
 */
#include "internal.h"
#include "proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct plan_parse {
  attn_plan_params *pp;
  bool have_seq_q, have_seq_kv, have_head_dim;
} plan_parse;

static int set_param(void *ctx, const char *name, size_t nlen, const char *value, size_t vlen,
                     bool has_value, attn_status *st) {
  plan_parse *pl = ctx;
  attn_plan_params *pp = pl->pp;
  char qn[48], qv[48];
  attn_quote(qn, sizeof qn, name, nlen);
  attn_quote(qv, sizeof qv, value, vlen);
  if (!strcmp(name, "pass")) {
    if (has_value && !strcmp(value, "forward"))
      pp->pass = ATTN_FORWARD;
    else if (has_value && !strcmp(value, "backward"))
      pp->pass = ATTN_BACKWARD;
    else
      return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                             "parameter \"pass\" must be forward or backward (got \"%s\")", qv);
    return 0;
  }
  if (!strcmp(name, "dtype")) {
    if (attn_dtype_parse(value, &pp->dtype) < 0)
      return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                             "parameter \"dtype\" must be F32, F16 or BF16 (got \"%s\")", qv);
    return 0;
  }
  static const char *const names[] = {"batch", "heads", "heads_kv", "seq_q", "seq_kv", "head_dim"};
  int64_t *slots[] = {&pp->batch, &pp->heads_q, &pp->heads_kv,
                      &pp->seq_q, &pp->seq_kv,  &pp->head_dim};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    if (strcmp(name, names[i]))
      continue;
    char *end;
    errno = 0;
    long long v = has_value ? strtoll(value, &end, 10) : 0;
    if (!has_value || !*value || *end || errno || v < 1)
      return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                             "parameter \"%s\" must be an integer of at least 1 (got \"%s\")", qn,
                             qv);
    *slots[i] = v;
    pl->have_seq_q |= i == 3;
    pl->have_seq_kv |= i == 4;
    pl->have_head_dim |= i == 5;
    return 0;
  }
  return attn_status_set(st, ATTN_PROTO_EOPTION,
                         "unknown parameter \"%s\" (parameters: batch, heads, heads_kv, "
                         "seq_q, seq_kv, head_dim, dtype, pass)",
                         qn);
}

int attn_proto_parse_plan_query(const char *query, attn_plan_params *pp, attn_status *st) {
  *pp = (attn_plan_params){.batch = 1, .heads_q = 1, .dtype = ATTN_F32};
  plan_parse pl = {.pp = pp};
  int rc = attn__query_each(query, set_param, &pl, st);
  if (rc < 0)
    return rc;
  if (!pl.have_seq_q || !pl.have_head_dim)
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                           "parameters \"seq_q\" and \"head_dim\" are required, e.g. "
                           "?seq_q=4096&head_dim=64");
  if (!pl.have_seq_kv)
    pp->seq_kv = pp->seq_q;
  return 0;
}

void attn_proto_plan_json(attn_sbuf *b, const attn_plan_params *p, const attn_plan *pl) {
  attn_sbuf_printf(b,
                   "{\"batch\": %lld, \"heads_q\": %lld, \"heads_kv\": %lld, \"seq_q\": %lld, "
                   "\"seq_kv\": %lld, \"head_dim\": %lld, \"dtype\": \"%s\", \"threads\": %d, "
                   "\"pass\": \"%s\",\n",
                   (long long)p->batch, (long long)p->heads_q,
                   (long long)(p->heads_kv ? p->heads_kv : p->heads_q), (long long)p->seq_q,
                   (long long)p->seq_kv, (long long)p->head_dim, attn_dtype_name(p->dtype),
                   pl->threads, pl->pass == ATTN_BACKWARD ? "backward" : "forward");
  attn_sbuf_printf(b,
                   " \"bytes\": {\"q\": %llu, \"k\": %llu, \"v\": %llu, \"o\": %llu, "
                   "\"s\": %llu, \"p\": %llu, \"s_plus_p\": %llu, \"m\": %llu, \"l\": %llu, "
                   "\"workspace_per_thread\": %llu, \"workspace\": %llu, "
                   "\"standard_total\": %llu, \"flash_total\": %llu},\n",
                   (unsigned long long)pl->q, (unsigned long long)pl->k, (unsigned long long)pl->v,
                   (unsigned long long)pl->o, (unsigned long long)pl->s, (unsigned long long)pl->p,
                   (unsigned long long)pl->s_plus_p, (unsigned long long)pl->m,
                   (unsigned long long)pl->l, (unsigned long long)pl->workspace_per_thread,
                   (unsigned long long)pl->workspace, (unsigned long long)pl->standard_total,
                   (unsigned long long)pl->flash_total);
  if (pl->pass == ATTN_BACKWARD)
    attn_sbuf_printf(b,
                     " \"backward_bytes\": {\"do\": %llu, \"dq\": %llu, \"dk\": %llu, "
                     "\"dv\": %llu, \"dp\": %llu, \"ds\": %llu, \"lse\": %llu, "
                     "\"delta\": %llu, \"dq_accum\": %llu},\n",
                     (unsigned long long)pl->dout, (unsigned long long)pl->dq,
                     (unsigned long long)pl->dk, (unsigned long long)pl->dv,
                     (unsigned long long)pl->dp, (unsigned long long)pl->ds,
                     (unsigned long long)pl->lse, (unsigned long long)pl->delta,
                     (unsigned long long)pl->dq_accum);
  attn_sbuf_printf(b, " \"ratios\": {\"s_over_q\": %.17g, \"standard_over_flash\": %.17g}}\n",
                   pl->s_over_q, pl->standard_over_flash);
}
