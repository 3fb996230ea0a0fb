/*
 * test_v2.c — proto/v2.c's refusals of keys and names that the
 * decoder once let through: a repeated key in any "parameters" object or
 * in an output's object (the last one won), and a name holding a NUL
 * ("q\u0000" read as q). The black-box /v2 tests are
 * tests/server/test_v2.c.
 */
#include "proto.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IN(name) \
  "{\"name\": \"" name "\", \"shape\": [1, 2], \"datatype\": \"FP32\", \"data\": [1, 2]}"
#define QKV IN("q") ", " IN("k") ", " IN("v")

/* Decodes a /v2 body that is all JSON. */
static int v2(const char *body, attn_proto_req *pr, attn_status *st) {
  attn_v2_info info;
  return attn_proto_decode_v2(body, strlen(body), strlen(body), pr, &info, st);
}

static void expect_ok(const char *body) {
  attn_proto_req pr;
  attn_status st = {0};
  cr_expect_eq(v2(body, &pr, &st), 0, "%s: %s", body, st.message);
  attn_proto_req_free(&pr);
}

static void expect_err(const char *body, int code, const char *needle) {
  attn_proto_req pr;
  attn_status st = {0};
  int rc = v2(body, &pr, &st);
  cr_expect_eq(rc, code, "%s: want %s, got %s (%s)", body, attn_proto_code_name(code),
               attn_proto_code_name(rc), st.message);
  cr_expect(strstr(st.message, needle), "%s: message \"%s\" lacks \"%s\"", body, st.message,
            needle);
  if (rc == 0)
    attn_proto_req_free(&pr);
}

/* The request's "parameters" refuse a repeated key as /attention's body does
 * (400 malformed_json), also when spelled with an escape. */
Test(v2_codec, repeated_parameters_are_refused) {
  expect_ok("{\"inputs\": [" QKV "], \"parameters\": {\"causal\": true, \"scale\": 0.5}}");
  expect_err("{\"inputs\": [" QKV "], \"parameters\": {\"causal\": true, \"causal\": false}}",
             ATTN_PROTO_EJSON, "duplicate key \"causal\" in \"parameters\"");
  expect_err("{\"inputs\": [" QKV "], \"parameters\": {\"scale\": 0.5, \"sc\\u0061le\": 2}}",
             ATTN_PROTO_EJSON, "duplicate key \"scale\" in \"parameters\"");
  expect_err("{\"inputs\": [" QKV "], \"parameters\": {\"binary_data_output\": false, "
             "\"backend\": \"cpu\", \"binary_data_output\": true}}",
             ATTN_PROTO_EJSON, "duplicate key \"binary_data_output\" in \"parameters\"");
}

/* So do an input's parameters, an output's object and its parameters. */
Test(v2_codec, repeated_keys_of_inputs_and_outputs_are_refused) {
  char body[1024];
  /* q as 8 bytes of binary data after the JSON */
  int n = snprintf(body, sizeof body,
                   "{\"inputs\": [{\"name\": \"q\", \"shape\": [1, 2], \"datatype\": \"FP32\", "
                   "\"parameters\": {\"binary_data_size\": 8, \"binary_data_size\": 8}}, " IN(
                       "k") ", " IN("v") "]}");
  memset(body + n, 0, 8);
  attn_proto_req pr;
  attn_v2_info info;
  attn_status st = {0};
  cr_expect_eq(attn_proto_decode_v2(body, (size_t)n + 8, (size_t)n, &pr, &info, &st),
               ATTN_PROTO_EJSON, "%s", st.message);
  cr_expect(strstr(st.message, "input \"q\": duplicate key \"binary_data_size\""), "%s",
            st.message);
  expect_ok("{\"inputs\": [" QKV "], \"outputs\": [{\"name\": \"o\", \"parameters\": "
            "{\"binary_data\": false}}]}");
  expect_err("{\"inputs\": [" QKV "], \"outputs\": [{\"name\": \"o\", \"name\": \"lse\"}]}",
             ATTN_PROTO_EJSON, "outputs[0]: duplicate key \"name\"");
  expect_err("{\"inputs\": [" QKV "], \"outputs\": [{\"name\": \"o\", \"parameters\": {}, "
             "\"parameters\": {\"binary_data\": true}}]}",
             ATTN_PROTO_EJSON, "outputs[0]: duplicate key \"parameters\"");
  expect_err("{\"inputs\": [" QKV "], \"outputs\": [{\"name\": \"o\"}, {\"name\": \"lse\", "
             "\"parameters\": {\"binary_data\": true, \"binary_data\": false}}]}",
             ATTN_PROTO_EJSON, "outputs[1]: duplicate key \"binary_data\" in its parameters");
}

/* A name read from a JSON string compares by its whole length: with a NUL
 * inside it names no input ("q\u0000" was taken as q) and no output, and an
 * id holding one is refused. */
Test(v2_codec, names_with_a_nul_are_unknown) {
  expect_err("{\"inputs\": [" IN("q\\u0000") ", " IN("k") ", " IN("v") "]}",
             ATTN_PROTO_EUNKNOWNTENSOR, "inputs[0]: the name must be");
  expect_err("{\"inputs\": [" IN("q") ", " IN("k\\u0000x") ", " IN("v") "]}",
             ATTN_PROTO_EUNKNOWNTENSOR, "inputs[1]: the name must be");
  expect_err("{\"inputs\": [" QKV ", " IN("alibi_slopes\\u0000") "]}", ATTN_PROTO_EUNKNOWNTENSOR,
             "inputs[3]: the name must be");
  expect_err("{\"inputs\": [" QKV "], \"outputs\": [{\"name\": \"o\\u0000\"}]}",
             ATTN_PROTO_EUNKNOWNTENSOR, "outputs[0]: the name must be");
  expect_err("{\"id\": \"a\\u0000b\", \"inputs\": [" QKV "]}", ATTN_PROTO_EJSON, "without NUL");
  expect_err("{\"inputs\": [{\"name\": \"q\", \"shape\": [1, 2], \"datatype\": \"FP32\\u0000\", "
             "\"data\": [1, 2]}, " IN("k") ", " IN("v") "]}",
             ATTN_PROTO_ETENSOR, "input \"q\": datatype");
}
