/*
 * harness_bodies.h — request bodies built from the random problems of
 * tests/lib/helpers.h, and replies checked against their float64 reference.
 *
 * The codecs here (json_body, st_body, parse_*_reply) are deliberately the
 * harness's own, not proto's: an oracle that shared proto's code would
 * share its bugs.
 */
#ifndef ATTND_TEST_HARNESS_BODIES_H
#define ATTND_TEST_HARNESS_BODIES_H

#include "harness_http.h"
#include "helpers.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Tensor shapes of rank 2 ([N, D], B = H = 1), 3 ([H, N, D], B = 1) or 4. */
void shape_of(const tprob *p, bool kv, int rank, int64_t out[4]);

/* JSON request {"q": {"shape", "dtype", "data"}, "k", "v" <extra>} where
 * extra is appended verbatim after v (e.g. ",\"causal\":true"); malloc'd. */
char *json_body(const tcase *c, int rank, const char *extra, size_t *plen);
/* JSON request with nested arrays (F32 only), shape inferred. */
char *json_nested_body(const tcase *c, int rank, const char *extra, size_t *plen);
/* safetensors request of rank 2-4 with an optional __metadata__ object text. */
char *st_body(const tcase *c, int rank, const char *metadata, size_t *plen);

/* Parse a reply into c->o (and c->m, c->l, c->lse when c->p.stats), checking
 * the shapes (q's shape at rank) and dtypes; stats present iff c->p.stats.
 * Return 0 or -1 with a message in err. */
int parse_json_reply(const char *body, size_t len, tcase *c, int rank, char *err, size_t cap);
int parse_st_reply(const void *body, size_t len, tcase *c, int rank, char *err, size_t cap);

/* Checks (cr_expect) that rs is a 200 reply of the expected codec whose
 * outputs match the float64 reference of c within ttol(dtype) (stats 1e-5,
 * fully masked rows exact). Returns whether all held. */
bool expect_correct(const http_res *rs, tcase *c, int rank, bool st_reply, const char *what);
/* The same without criterion (for worker threads): returns NULL when right,
 * else a message in err. */
const char *check_correct(const http_res *rs, tcase *c, int rank, bool st_reply, char *err,
                          size_t cap);

/* The string member k of o, or NULL when absent or not a string: replies'
 * fields read without a NULL check at each step. */
const char *jstr(const cJSON *o, const char *k);

/* Slow job bodies: backend=reference on H heads of N x 64 (F32,
 * safetensors), about H * N^2 * 64 * 4 flops of scalar float64 work. */
char *slow_body(tcase *c, int heads, int n, size_t *plen);
/* A small backend=reference body (one 64 x 64 head): under srv_hold_bin()
 * its job is held, running, until it is canceled or released. */
char *held_body(tcase *c, size_t *plen);

#endif
