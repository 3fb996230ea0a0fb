/* bad_cases.c — see bad_cases.h. */
#include "bad_cases.h"

#include <stdlib.h>
#include <string.h>

#define JSON "application/json"
#define OCTET "application/octet-stream"

/* A valid small JSON request: q [2, 4], k and v [3, 4]. */
#define JQ "\"q\":{\"shape\":[2,4],\"data\":[1,0,0,1,0.5,0.5,-1,2]}"
#define JK "\"k\":{\"shape\":[3,4],\"data\":[1,0,0,1,0,1,1,0,0.5,0.25,-0.5,1]}"
#define JV "\"v\":{\"shape\":[3,4],\"data\":[1,2,3,4,5,6,7,8,9,10,11,12]}"
#define JQKV JQ "," JK "," JV

/* A valid safetensors header: the same shapes, F32, 128 bytes of data. */
#define SQ(dt) "\"q\":{\"dtype\":\"" dt "\",\"shape\":[2,4],\"data_offsets\":[0,32]}"
#define SK(dt) "\"k\":{\"dtype\":\"" dt "\",\"shape\":[3,4],\"data_offsets\":[32,80]}"
#define SV(dt) "\"v\":{\"dtype\":\"" dt "\",\"shape\":[3,4],\"data_offsets\":[80,128]}"
#define SQKV SQ("F32") "," SK("F32") "," SV("F32")

#define J(n_, body_, st_, code_) \
  { .name = n_, .ctype = JSON, .text = body_, .status = st_, .code = code_ }
#define JP(n_, p_, body_, st_, code_) \
  { .name = n_, .path = p_, .ctype = JSON, .text = body_, .status = st_, .code = code_ }
#define S(n_, hdr_, dl_, st_, code_)                                                  \
  {                                                                                   \
    .name = n_, .ctype = OCTET, .st = true, .text = hdr_, .dlen = dl_, .status = st_, \
    .code = code_                                                                     \
  }

const bad_case bad_cases[] = {
    /* ---- JSON bodies: syntax (400) ---- */
    J("json: unterminated object", "{", 400, "malformed_json"),
    J("json: truncated request", "{" JQ "," JK ",\"v\":{\"shape\":[3,4],\"data\":[1,2", 400,
      "malformed_json"),
    J("json: top level array", "[1,2,3]", 400, "malformed_json"),
    J("json: top level string", "\"qkv\"", 400, "malformed_json"),
    J("json: top level null", "null", 400, "malformed_json"),
    J("json: trailing garbage", "{" JQKV "} xyz", 400, "malformed_json"),
    J("json: duplicate key q", "{" JQ "," JQ "," JK "," JV "}", 400, "malformed_json"),
    J("json: nesting 7 deep", "{\"q\":[[[[[[1]]]]]]," JK "," JV "}", 400, "malformed_json"),
    J("json: single quotes", "{'q': 1}", 400, "malformed_json"),
    J("json: binary garbage", "\x01\x02\x03\xff\xfe", 400, "malformed_json"),
    /* ---- JSON bodies: tensors (422) ---- */
    J("json: empty object", "{}", 422, "missing_tensor"),
    J("json: v missing", "{" JQ "," JK "}", 422, "missing_tensor"),
    J("json: q is a number", "{\"q\":5," JK "," JV "}", 422, "invalid_tensor"),
    J("json: shape is a string",
      "{\"q\":{\"shape\":\"2x4\",\"data\":[1,0,0,1,0.5,0.5,-1,2]}," JK "," JV "}", 422,
      "invalid_tensor"),
    J("json: tensor with an extra key",
      "{\"q\":{\"shape\":[2,4],\"data\":[1,0,0,1,0.5,0.5,-1,2],\"foo\":1}," JK "," JV "}", 422,
      "invalid_tensor"),
    J("json: tensor without data", "{\"q\":{\"shape\":[2,4]}," JK "," JV "}", 422,
      "invalid_tensor"),
    J("json: dtype F64",
      "{\"q\":{\"shape\":[2,4],\"dtype\":\"F64\",\"data\":[1,0,0,1,0.5,0.5,-1,2]}," JK "," JV "}",
      422, "invalid_tensor"),
    J("json: rank 1", "{\"q\":{\"shape\":[8],\"data\":[1,0,0,1,0.5,0.5,-1,2]}," JK "," JV "}", 422,
      "invalid_tensor"),
    J("json: rank 5",
      "{\"q\":{\"shape\":[1,1,1,2,4],\"data\":[1,0,0,1,0.5,0.5,-1,2]}," JK "," JV "}", 422,
      "invalid_tensor"),
    J("json: 7 values for shape [2,4]",
      "{\"q\":{\"shape\":[2,4],\"data\":[1,0,0,1,0.5,0.5,-1]}," JK "," JV "}", 422,
      "invalid_tensor"),
    J("json: a string among the data",
      "{\"q\":{\"shape\":[2,4],\"data\":[1,0,0,1,\"x\",0.5,-1,2]}," JK "," JV "}", 422,
      "invalid_tensor"),
    J("json: negative dimension",
      "{\"q\":{\"shape\":[-2,4],\"data\":[1,0,0,1,0.5,0.5,-1,2]}," JK "," JV "}", 422,
      "invalid_tensor"),
    J("json: zero dimension", "{\"q\":{\"shape\":[0,4],\"data\":[]}," JK "," JV "}", 422,
      "invalid_tensor"),
    J("json: ragged nested arrays", "{\"q\":[[1,2,3,4],[1,2]]," JK "," JV "}", 422,
      "invalid_tensor"),
    J("json: 1e999 (infinity)",
      "{\"q\":{\"shape\":[2,4],\"data\":[1,0,0,1e999,0.5,0.5,-1,2]}," JK "," JV "}", 422,
      "non_finite"),
    J("json: -1e999 in v",
      "{" JQ "," JK ",\"v\":{\"shape\":[3,4],\"data\":[1,2,3,4,5,6,7,8,9,10,11,-1e999]}}", 422,
      "non_finite"),
    J("json: 70000 in F16",
      "{\"q\":{\"shape\":[2,4],\"dtype\":\"F16\",\"data\":[1,0,0,70000,0.5,0.5,-1,2]},"
      "\"k\":{\"shape\":[3,4],\"dtype\":\"F16\",\"data\":[1,0,0,1,0,1,1,0,0.5,0.25,-0.5,1]},"
      "\"v\":{\"shape\":[3,4],\"dtype\":\"F16\",\"data\":[1,2,3,4,5,6,7,8,9,10,11,12]}}",
      422, "non_finite"),
    J("json: q F32, k and v F16",
      "{" JQ
      ",\"k\":{\"shape\":[3,4],\"dtype\":\"F16\",\"data\":[1,0,0,1,0,1,1,0,0.5,0.25,-0.5,1]},"
      "\"v\":{\"shape\":[3,4],\"dtype\":\"F16\",\"data\":[1,2,3,4,5,6,7,8,9,10,11,12]}}",
      422, "dtype_mismatch"),
    J("json: head dims 4 and 6",
      "{" JQ ",\"k\":{\"shape\":[2,6],\"data\":[1,0,0,1,0,1,1,0,0.5,0.25,-0.5,1]},"
      "\"v\":{\"shape\":[2,6],\"data\":[1,2,3,4,5,6,7,8,9,10,11,12]}}",
      422, "shape_mismatch"),
    J("json: ranks 2 and 3",
      "{" JQ ",\"k\":{\"shape\":[1,3,4],\"data\":[1,0,0,1,0,1,1,0,0.5,0.25,-0.5,1]},"
      "\"v\":{\"shape\":[1,3,4],\"data\":[1,2,3,4,5,6,7,8,9,10,11,12]}}",
      422, "shape_mismatch"),
    J("json: k [3,4], v [2,4]",
      "{" JQ "," JK ",\"v\":{\"shape\":[2,4],\"data\":[1,2,3,4,5,6,7,8]}}", 422, "shape_mismatch"),
    J("json: 3 query heads over 2 kv heads",
      "{\"q\":{\"shape\":[3,1,2],\"data\":[1,0,0,1,0.5,0.5]},"
      "\"k\":{\"shape\":[2,1,2],\"data\":[1,0,0,1]},\"v\":{\"shape\":[2,1,2],\"data\":[1,2,3,4]}}",
      422, "shape_mismatch"),
    /* ---- JSON bodies: options (422) ---- */
    J("json: unknown key casual", "{" JQKV ",\"casual\":true}", 422, "unknown_option"),
    J("json: causal \"yes\"", "{" JQKV ",\"causal\":\"yes\"}", 422, "invalid_option"),
    J("json: causal 1 (not a boolean)", "{" JQKV ",\"causal\":1}", 422, "invalid_option"),
    J("json: stats \"true\" (a string)", "{" JQKV ",\"stats\":\"true\"}", 422, "invalid_option"),
    J("json: scale \"0.5\" (a string)", "{" JQKV ",\"scale\":\"0.5\"}", 422, "invalid_option"),
    J("json: scale 1e999", "{" JQKV ",\"scale\":1e999}", 422, "invalid_option"),
    J("json: window_left -2", "{" JQKV ",\"window_left\":-2}", 422, "invalid_option"),
    J("json: window_right 1.5", "{" JQKV ",\"window_right\":1.5}", 422, "invalid_option"),
    J("json: diag_offset past 2^40", "{" JQKV ",\"diag_offset\":1099511627777}", 422,
      "invalid_option"),
    J("json: diag_offset 0.5", "{" JQKV ",\"diag_offset\":0.5}", 422, "invalid_option"),
    J("json: diag_offset a string", "{" JQKV ",\"diag_offset\":\"0\"}", 422, "invalid_option"),
    J("json: backend tpu", "{" JQKV ",\"backend\":\"tpu\"}", 422, "invalid_option"),
    J("json: backend 3", "{" JQKV ",\"backend\":3}", 422, "invalid_option"),
    /* ---- the engine's checks (422) ---- */
    J("json: causal with window_right 3", "{" JQKV ",\"causal\":true,\"window_right\":3}", 422,
      "invalid_window"),
    J("json: scale 1e38 (scores overflow F32)", "{" JQKV ",\"scale\":1e38}", 422, "out_of_range"),
    /* ---- query strings ---- */
    JP("query: unknown option foo", "/attention?foo=1", "{" JQKV "}", 422, "unknown_option"),
    JP("query: causal=maybe", "/attention?causal=maybe", "{" JQKV "}", 422, "invalid_option"),
    JP("query: scale=nan", "/attention?scale=nan", "{" JQKV "}", 422, "invalid_option"),
    JP("query: scale=inf", "/attention?scale=inf", "{" JQKV "}", 422, "invalid_option"),
    JP("query: window_right=-5", "/attention?window_right=-5", "{" JQKV "}", 422, "invalid_option"),
    JP("query: window_left=abc", "/attention?window_left=abc", "{" JQKV "}", 422, "invalid_option"),
    JP("query: diag_offset=-2^40-1", "/attention?diag_offset=-1099511627777", "{" JQKV "}", 422,
       "invalid_option"),
    JP("query: backend=tpu", "/attention?backend=tpu", "{" JQKV "}", 422, "invalid_option"),
    JP("query: stats=%ZZ", "/attention?stats=%ZZ", "{" JQKV "}", 422, "invalid_option"),
    /* ---- content types and empty bodies ---- */
    {.name = "ctype: text/plain",
     .ctype = "text/plain",
     .text = "{" JQKV "}",
     .status = 415,
     .code = "unsupported_media_type"},
    {.name = "ctype: none",
     .ctype = NULL,
     .text = "{" JQKV "}",
     .status = 415,
     .code = "unsupported_media_type"},
    {.name = "ctype: application/xml",
     .ctype = "application/xml",
     .text = "<q/>",
     .status = 415,
     .code = "unsupported_media_type"},
    {.name = "ctype: application/jsonx",
     .ctype = "application/jsonx",
     .text = "{" JQKV "}",
     .status = 415,
     .code = "unsupported_media_type"},
    {.name = "ctype: x-www-form-urlencoded",
     .ctype = "application/x-www-form-urlencoded",
     .text = "q=1&k=2",
     .status = 415,
     .code = "unsupported_media_type"},
    {.name = "ctype: multipart/form-data",
     .ctype = "multipart/form-data; boundary=x",
     .text = "--x--",
     .status = 415,
     .code = "unsupported_media_type"},
    {.name = "empty JSON body", .ctype = JSON, .text = "", .status = 400, .code = "empty_body"},
    {.name = "empty safetensors body",
     .ctype = OCTET,
     .text = "",
     .status = 400,
     .code = "empty_body"},
    /* ---- safetensors bodies ---- */
    {.name = "st: 4-byte body",
     .ctype = OCTET,
     .text = "abcd",
     .status = 400,
     .code = "malformed_safetensors"},
    /* A header length past the body is a broken file (400), however large;
     * 413 is only for a header the body holds that is over the cap. */
    {.name = "st: a JSON body sent as octet-stream",
     .ctype = OCTET,
     .text = "{" JQKV "}",
     .status = 400,
     .code = "malformed_safetensors"}, /* "{\"q\":{\"s" read as a length: ~2^62 */
    {.name = "st: header length 2^63 (huge)",
     .ctype = OCTET,
     .st = true,
     .text = "{" SQKV "}",
     .dlen = 128,
     .hlen = (uint64_t)1 << 63,
     .status = 400,
     .code = "malformed_safetensors"},
    {.name = "st: header length 200 MiB",
     .ctype = OCTET,
     .st = true,
     .text = "{" SQKV "}",
     .dlen = 128,
     .hlen = 200u << 20,
     .status = 400,
     .code = "malformed_safetensors"},
    {.name = "st: header length past the body",
     .ctype = OCTET,
     .st = true,
     .text = "{" SQKV "}",
     .dlen = 128,
     .hlen = 100000,
     .status = 400,
     .code = "malformed_safetensors"},
    {.name = "st: header length 0",
     .ctype = OCTET,
     .st = true,
     .text = "{" SQKV "}",
     .dlen = 128,
     .zero_hlen = true,
     .status = 400,
     .code = "malformed_safetensors"},
    S("st: header not JSON", "{\"q\":{\"dtype\":", 128, 400, "malformed_safetensors"),
    S("st: header is an array", "[1,2,3]", 0, 400, "malformed_safetensors"),
    S("st: NUL byte in the header", "{" SQ("F32") ",\"k\\u0000\":1}", 128, 400,
      "malformed_safetensors"),
    S("st: duplicate tensor", "{" SQ("F32") "," SQ("F32") "," SK("F32") "," SV("F32") "}", 128, 400,
      "malformed_safetensors"),
    S("st: entry with an extra field",
      "{\"q\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,32],\"x\":1}," SK(
          "F32") "," SV("F32") "}",
      128, 400, "malformed_safetensors"),
    S("st: data_offsets past the end",
      "{" SQ("F32") "," SK("F32") ",\"v\":{\"dtype\":\"F32\",\"shape\":[3,4],"
                                  "\"data_offsets\":[80,4000]}}",
      128, 400, "malformed_safetensors"),
    S("st: overlapping tensors",
      "{" SQ("F32") ",\"k\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[16,64]},"
                    "\"v\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[64,112]}}",
      112, 400, "malformed_safetensors"),
    S("st: a hole between tensors",
      "{" SQ("F32") ",\"k\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[48,96]},"
                    "\"v\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[96,144]}}",
      144, 400, "malformed_safetensors"),
    S("st: trailing bytes after the last tensor", "{" SQKV "}", 136, 400, "malformed_safetensors"),
    S("st: offsets not matching the shape",
      "{\"q\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,28]},"
      "\"k\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[28,76]},"
      "\"v\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[76,124]}}",
      124, 400, "malformed_safetensors"),
    {.name = "st: body truncated by 10 bytes",
     .ctype = OCTET,
     .st = true,
     .text = "{" SQKV "}",
     .dlen = 128,
     .cut = 10,
     .status = 400,
     .code = "malformed_safetensors"},
    S("st: unknown tensor x",
      "{" SQKV ",\"x\":{\"dtype\":\"F32\",\"shape\":[1,1],"
      "\"data_offsets\":[128,132]}}",
      132, 422, "unknown_tensor"),
    S("st: v missing", "{" SQ("F32") "," SK("F32") "}", 80, 422, "missing_tensor"),
    S("st: dtype I32", "{" SQ("I32") "," SK("F32") "," SV("F32") "}", 128, 422, "invalid_tensor"),
    S("st: rank 1 tensor",
      "{\"q\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]}," SK("F32") "," SV(
          "F32") "}",
      128, 422, "invalid_tensor"),
    S("st: q F32, k and v F16",
      "{" SQ("F32") ",\"k\":{\"dtype\":\"F16\",\"shape\":[3,4],\"data_offsets\":[32,56]},"
                    "\"v\":{\"dtype\":\"F16\",\"shape\":[3,4],\"data_offsets\":[56,80]}}",
      80, 422, "dtype_mismatch"),
    S("st: k [3,4], v [4,3]",
      "{" SQ("F32") "," SK("F32") ",\"v\":{\"dtype\":\"F32\",\"shape\":[4,3],"
                                  "\"data_offsets\":[80,128]}}",
      128, 422, "shape_mismatch"),
    S("st: head dim 577",
      "{\"q\":{\"dtype\":\"BF16\",\"shape\":[1,577],\"data_offsets\":[0,1154]},"
      "\"k\":{\"dtype\":\"BF16\",\"shape\":[1,577],\"data_offsets\":[1154,2308]},"
      "\"v\":{\"dtype\":\"BF16\",\"shape\":[1,577],\"data_offsets\":[2308,3462]}}",
      3462, 422, "invalid_shape"),
    S("st: metadata causal maybe", "{\"__metadata__\":{\"causal\":\"maybe\"}," SQKV "}", 128, 422,
      "invalid_option"),
    S("st: metadata unknown option", "{\"__metadata__\":{\"casual\":\"true\"}," SQKV "}", 128, 422,
      "unknown_option"),
    S("st: metadata value not a string", "{\"__metadata__\":{\"causal\":true}," SQKV "}", 128, 422,
      "invalid_option"),
    S("st: backend=reference on 4200 x 4200 scores",
      "{\"__metadata__\":{\"backend\":\"reference\"},"
      "\"q\":{\"dtype\":\"F32\",\"shape\":[4200,1],\"data_offsets\":[0,16800]},"
      "\"k\":{\"dtype\":\"F32\",\"shape\":[4200,1],\"data_offsets\":[16800,33600]},"
      "\"v\":{\"dtype\":\"F32\",\"shape\":[4200,1],\"data_offsets\":[33600,50400]}}",
      50400, 413, "too_large_for_backend"),
    {.name = "st: NaN in q (F32)",
     .ctype = OCTET,
     .st = true,
     .text = "{" SQKV "}",
     .dlen = 128,
     .poff = 4,
     .pbytes = "\x00\x00\xc0\x7f",
     .plen = 4,
     .status = 422,
     .code = "non_finite"},
    {.name = "st: +inf in k (F32)",
     .ctype = OCTET,
     .st = true,
     .text = "{" SQKV "}",
     .dlen = 128,
     .poff = 40,
     .pbytes = "\x00\x00\x80\x7f",
     .plen = 4,
     .status = 422,
     .code = "non_finite"},
    {.name = "st: NaN in v (F16)",
     .ctype = OCTET,
     .st = true,
     .text = "{\"q\":{\"dtype\":\"F16\",\"shape\":[2,4],\"data_offsets\":[0,16]},"
             "\"k\":{\"dtype\":\"F16\",\"shape\":[3,4],\"data_offsets\":[16,40]},"
             "\"v\":{\"dtype\":\"F16\",\"shape\":[3,4],\"data_offsets\":[40,64]}}",
     .dlen = 64,
     .poff = 50,
     .pbytes = "\x00\x7e",
     .plen = 2,
     .status = 422,
     .code = "non_finite"},
    {.name = "st: -inf in q (BF16)",
     .ctype = OCTET,
     .st = true,
     .text = "{\"q\":{\"dtype\":\"BF16\",\"shape\":[2,4],\"data_offsets\":[0,16]},"
             "\"k\":{\"dtype\":\"BF16\",\"shape\":[3,4],\"data_offsets\":[16,40]},"
             "\"v\":{\"dtype\":\"BF16\",\"shape\":[3,4],\"data_offsets\":[40,64]}}",
     .dlen = 64,
     .poff = 2,
     .pbytes = "\x80\xff",
     .plen = 2,
     .status = 422,
     .code = "non_finite"},
    /* ---- paths and methods ---- */
    {.name = "GET /nope", .method = "GET", .path = "/nope", .status = 404, .code = "not_found"},
    /* (under /v2 a 404 is the inference protocol's error: tests/server/test_v2.c) */
    {.name = "POST /v1/attention",
     .path = "/v1/attention",
     .ctype = JSON,
     .text = "{" JQKV "}",
     .status = 404,
     .code = "not_found"},
    {.name = "GET /attention/plans",
     .method = "GET",
     .path = "/attention/plans",
     .status = 404,
     .code = "not_found"},
    {.name = "GET /attention",
     .method = "GET",
     .path = "/attention",
     .status = 405,
     .code = "method_not_allowed",
     .allow = "POST"},
    {.name = "PUT /attention",
     .method = "PUT",
     .path = "/attention",
     .ctype = JSON,
     .text = "{" JQKV "}",
     .status = 405,
     .code = "method_not_allowed",
     .allow = "POST"},
    {.name = "POST /healthz",
     .path = "/healthz",
     .ctype = JSON,
     .text = "{}",
     .status = 405,
     .code = "method_not_allowed",
     .allow = "GET"},
    {.name = "DELETE /metrics",
     .method = "DELETE",
     .path = "/metrics",
     .status = 405,
     .code = "method_not_allowed",
     .allow = "GET"},
    {.name = "POST /v1/info",
     .path = "/v1/info",
     .ctype = JSON,
     .text = "{}",
     .status = 405,
     .code = "method_not_allowed",
     .allow = "GET"},
    {.name = "POST /attention/plan",
     .path = "/attention/plan?seq_q=4&head_dim=4",
     .ctype = JSON,
     .text = "{}",
     .status = 405,
     .code = "method_not_allowed",
     .allow = "GET"},
    {.name = "PATCH /readyz",
     .method = "PATCH",
     .path = "/readyz",
     .status = 405,
     .code = "method_not_allowed",
     .allow = "GET"},
};
const size_t n_bad_cases = sizeof bad_cases / sizeof *bad_cases;

char *bad_body(const bad_case *c, size_t *plen) {
  if (!c->text) {
    *plen = 0;
    return NULL;
  }
  if (!c->st) {
    size_t n = strlen(c->text);
    char *b = malloc(n + 1);
    memcpy(b, c->text, n + 1);
    *plen = n;
    return b;
  }
  size_t hl = strlen(c->text), len = 8 + hl + c->dlen;
  char *b = malloc(len);
  uint64_t h = c->hlen ? c->hlen : hl;
  if (c->zero_hlen)
    h = 0;
  for (int i = 0; i < 8; i++)
    b[i] = (char)(h >> (8 * i));
  memcpy(b + 8, c->text, hl);
  /* 0x3c00 little-endian: 1.0 in F16, finite in F32 and BF16 too. */
  for (size_t i = 0; i < c->dlen; i++)
    b[8 + hl + i] = (char)(i % 2 ? 0x3c : 0x00);
  if (c->pbytes && c->poff + c->plen <= c->dlen)
    memcpy(b + 8 + hl + c->poff, c->pbytes, c->plen);
  *plen = len - (c->cut < len ? c->cut : len);
  return b;
}
