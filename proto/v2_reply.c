/*
 * v2_reply.c — what attnd writes for the Open Inference Protocol: the
 * infer reply (JSON, with binary outputs after it as Triton's binary tensor
 * extension has them), the error body, and the metadata documents of the
 * server and of its models, with the model table they describe.
 */
#include "internal.h"
#include "proto.h"

#include <stdlib.h>
#include <string.h>

static const char *const model_names[ATTN_V2_NMODELS] = {"attention", "attention_fp16",
                                                         "attention_bf16"};
static const attn_dtype model_dtypes[ATTN_V2_NMODELS] = {ATTN_F32, ATTN_F16, ATTN_BF16};
const char *const attn__v2_out_names[ATTN_V2_NOUTS] = {"o", "m", "l", "lse"};

int attn_proto_v2_model(const char *name, size_t len) {
  for (int i = 0; i < ATTN_V2_NMODELS; i++)
    if (strlen(model_names[i]) == len && !memcmp(model_names[i], name, len))
      return i;
  return -1;
}

const char *attn_proto_v2_model_name(int model) {
  return model >= 0 && model < ATTN_V2_NMODELS ? model_names[model] : NULL;
}

const char *attn_proto_v2_datatype(attn_dtype dt) {
  return dt == ATTN_F16 ? "FP16" : dt == ATTN_BF16 ? "BF16" : "FP32";
}

static void put_dims(attn_sbuf *b, const int64_t *shape, int rank) {
  attn_sbuf_puts(b, "[");
  for (int i = 0; i < rank; i++)
    attn_sbuf_printf(b, i ? ", %lld" : "%lld", (long long)shape[i]);
  attn_sbuf_puts(b, "]");
}

/* The JSON of the reply into b; the binary outputs' parts into parts[]. */
static int reply_json(attn_sbuf *b, const attn_proto_req *pr, const attn_v2_info *info,
                      const char *model, const char *id, const char *backend,
                      const void *parts[ATTN__MAX_OUTS], size_t sizes[ATTN__MAX_OUTS]) {
  attn__out t[ATTN__MAX_OUTS];
  int n = attn__reply_outs(pr, false, t), np = 0;
  attn_sbuf_puts(b, "{\"model_name\": ");
  attn_sbuf_json_str(b, model);
  attn_sbuf_puts(b, ", \"model_version\": \"1\"");
  if (id) {
    attn_sbuf_puts(b, ", \"id\": ");
    attn_sbuf_json_str(b, id);
  }
  attn_sbuf_puts(b, ", \"parameters\": {\"backend\": ");
  attn_sbuf_json_str(b, backend ? backend : "");
  attn_sbuf_puts(b, "}, \"outputs\": [");
  for (int i = 0, first = 1; i < n; i++) {
    if (!(info->outputs & 1u << i) || !t[i].data)
      continue;
    attn_sbuf_printf(b, "%s{\"name\": \"%s\", \"datatype\": \"%s\", \"shape\": ", first ? "" : ", ",
                     t[i].name, attn_proto_v2_datatype(t[i].dtype));
    put_dims(b, t[i].shape, t[i].rank);
    size_t bytes = t[i].count * attn_dtype_size(t[i].dtype);
    if (info->binary & 1u << i) {
      attn_sbuf_printf(b, ", \"parameters\": {\"binary_data_size\": %zu}}", bytes);
      parts[np] = t[i].data;
      sizes[np++] = bytes;
    } else {
      attn_sbuf_puts(b, ", \"data\": [");
      attn__json_put_elems(b, t[i].dtype, t[i].data, t[i].count);
      attn_sbuf_puts(b, "]}");
    }
    first = 0;
  }
  attn_sbuf_puts(b, "]}");
  return np;
}

int attn_proto_encode_v2_parts(const attn_proto_req *pr, const attn_v2_info *info,
                               const char *model, const char *fallback_id, const char *backend,
                               void **phead, size_t *phlen,
                               attn_proto_part parts[ATTN_PROTO_MAX_PARTS], int *nparts,
                               attn_status *st) {
  *phead = NULL;
  *phlen = 0;
  *nparts = 0;
  if (pr->rank < 2 || pr->rank > 4 || !pr->req.o || pr->req.pass != ATTN_FORWARD)
    return attn_status_set(st, ATTN_EINVAL, "encode_v2: the request has no forward result");
  const void *data[ATTN__MAX_OUTS];
  size_t sizes[ATTN__MAX_OUTS];
  attn_sbuf b = {0};
  const char *id = info->has_id ? info->id : fallback_id;
  int np = reply_json(&b, pr, info, model, id, backend, data, sizes);
  if (b.oom) {
    free(b.p);
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory encoding the reply");
  }
  for (int i = 0; i < np; i++)
    parts[i] = (attn_proto_part){data[i], sizes[i]};
  *phead = b.p;
  *phlen = b.len;
  *nparts = np;
  return 0;
}

char *attn_proto_v2_error_body(const char *message, size_t *plen) {
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{\"error\": ");
  attn_sbuf_json_strn(&b, message ? message : "", message ? strlen(message) : 0,
                      ATTN_PROTO_MAX_MESSAGE);
  attn_sbuf_puts(&b, "}\n");
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  *plen = b.len;
  return b.p;
}

/* ---- metadata ------------------------------------------------------------------ */

void attn_proto_v2_server_metadata(attn_sbuf *b) {
  /* Only what is implemented: binary tensors, parameters, and Triton's
   * model configuration (GET .../config, which perf_analyzer reads). */
  attn_sbuf_printf(b,
                   "{\"name\": \"attnd\", \"version\": \"%s\", \"extensions\": "
                   "[\"binary_tensor_data\", \"parameters\", \"model_configuration\"]}\n",
                   ATTN_VERSION);
}

/* One tensor of the metadata, or with cfg of Triton's configuration,
 * which spells it differently (data_type TYPE_FP32, dims). */
static void put_meta(attn_sbuf *b, bool cfg, bool first, const char *name, const char *dt,
                     int rank) {
  attn_sbuf_printf(b, "%s{\"name\": \"%s\", ", first ? "" : ", ", name);
  if (cfg)
    attn_sbuf_printf(b, "\"data_type\": \"TYPE_%s\", \"dims\": ", dt);
  else
    attn_sbuf_printf(b, "\"datatype\": \"%s\", \"shape\": ", dt);
  attn_sbuf_puts(b, rank == 4 ? "[-1, -1, -1, -1]}" : "[-1, -1, -1]}");
}

/* inputs q, k, v and outputs o, m, l, lse (statistics FP32, q's shape less
 * its last dimension). The optional inputs (alibi_slopes, cu_seqlens_q/kv)
 * are left out: perf_analyzer generates data for every input listed, even
 * one marked optional, and stops at their dynamic shapes ("input
 * alibi_slopes contains dynamic shape"), while made-up offsets would be
 * refused; proto/README.md documents them instead. */
static void put_tensors(attn_sbuf *b, int model, bool cfg) {
  const char *dt = attn_proto_v2_datatype(model_dtypes[model]);
  attn_sbuf_puts(b, cfg ? "\"input\": [" : "\"inputs\": [");
  for (int i = 0; i < 3; i++)
    put_meta(b, cfg, i == 0, attn_proto_tensor_name(i), dt, 4);
  attn_sbuf_puts(b, cfg ? "], \"output\": [" : "], \"outputs\": [");
  for (int i = 0; i < ATTN_V2_NOUTS; i++)
    put_meta(b, cfg, i == 0, attn__v2_out_names[i], i ? "FP32" : dt, i ? 3 : 4);
  attn_sbuf_puts(b, "]");
}

void attn_proto_v2_model_metadata(attn_sbuf *b, int model) {
  attn_sbuf_puts(b, "{\"name\": ");
  attn_sbuf_json_str(b, model_names[model]);
  attn_sbuf_puts(b, ", \"versions\": [\"1\"], \"platform\": \"attnd\", ");
  put_tensors(b, model, false);
  attn_sbuf_puts(b, "}\n");
}

void attn_proto_v2_model_config(attn_sbuf *b, int model) {
  attn_sbuf_puts(b, "{\"name\": ");
  attn_sbuf_json_str(b, model_names[model]);
  attn_sbuf_puts(b, ", \"platform\": \"attnd\", \"backend\": \"attnd\", \"max_batch_size\": 0, "
                    "\"model_transaction_policy\": {\"decoupled\": false}, ");
  put_tensors(b, model, true);
  attn_sbuf_puts(b, "}\n");
}
