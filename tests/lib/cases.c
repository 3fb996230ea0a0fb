/* cases.c — the conformance problem lists; see cases.h. */
#include "cases.h"

/* Every (N, D) of the awkward set: F32, GQA 2:1, with statistics. */
int tcases_sizes(tprob *ps) {
  static const int64_t ns[] = {1, 7, 63, 64, 65, 113, 257, 1000};
  static const int64_t ds[] = {1, 37, 64, 80, 128, 256};
  int n = 0;
  for (size_t i = 0; i < sizeof ns / sizeof *ns; i++)
    for (size_t j = 0; j < sizeof ds / sizeof *ds; j++) {
      ps[n] = tprob_make(1, 2, 1, ns[i], ns[i], ds[j], ATTN_F32);
      ps[n].stats = true;
      n++;
    }
  return n;
}

/* Masks on square and cross shapes, both ways, in all dtypes. */
int tcases_masks(tprob *ps) {
  static const int64_t nn[][2] = {{1, 1},     {7, 63},    {65, 64},   {113, 257},
                                  {257, 113}, {64, 1000}, {1000, 64}, {1, 1000}};
  static const int64_t win[][3] = {/* causal, left, right */
                                   {1, -1, -1}, {0, 16, 0},   {0, 3, 5},  {0, 0, 0},
                                   {0, -1, 7},  {0, 100, -1}, {1, 40, -1}};
  int n = 0;
  for (size_t i = 0; i < sizeof nn / sizeof *nn; i++)
    for (size_t w = 0; w < sizeof win / sizeof *win; w++) {
      attn_dtype dt = (attn_dtype)((i + w) % 3);
      int64_t d = (i + w) % 2 ? 64 : 37;
      tprob p = tprob_make(1, 2, 2, nn[i][0], nn[i][1], d, dt);
      p.causal = win[w][0];
      p.wl = win[w][1];
      p.wr = win[w][2];
      p.stats = true;
      ps[n++] = p;
    }
  return n;
}

/* Batches, GQA and MQA, strided layouts, explicit scales, F16/BF16 sizes. */
int tcases_shapes(tprob *ps) {
  int n = 0;
  tprob p;
  p = tprob_make(3, 8, 2, 65, 65, 64, ATTN_F32);
  ps[n++] = p; /* GQA 4:1 */
  p = tprob_make(2, 4, 1, 113, 113, 128, ATTN_F32);
  p.causal = 1;
  ps[n++] = p; /* MQA */
  p = tprob_make(2, 6, 3, 63, 257, 80, ATTN_BF16);
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 4, 2, 257, 63, 128, ATTN_F16);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(2, 4, 2, 100, 130, 64, ATTN_F32);
  p.strided = 1;
  p.causal = 1;
  ps[n++] = p;
  p = tprob_make(1, 2, 1, 77, 77, 37, ATTN_F16);
  p.strided = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 1, 1, 64, 64, 64, ATTN_F32);
  p.scale = 0.5;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 1, 1, 65, 65, 64, ATTN_F32);
  p.scale = -0.3;
  ps[n++] = p;
  p = tprob_make(1, 1, 1, 33, 33, 16, ATTN_F32);
  p.scale = 0;
  p.stats = 1;
  ps[n++] = p;
  /* short query sequences under GQA pack several heads into one block,
   * including groups that do not split evenly (12 heads, 9 per block) */
  p = tprob_make(2, 8, 2, 1, 300, 64, ATTN_F32);
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 8, 2, 3, 200, 37, ATTN_F16);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 12, 1, 7, 150, 32, ATTN_BF16);
  p.wl = 20;
  p.wr = 2;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 4, 2, 32, 90, 16, ATTN_F32);
  p.causal = 1;
  p.wl = 5;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 6, 3, 40, 40, 8, ATTN_F32);
  p.strided = 1;
  p.causal = 1;
  ps[n++] = p;
  /* decoding-like shapes: few query rows over many keys, windows that leave
   * most tiles invisible to some rows */
  p = tprob_make(1, 1, 1, 1, 2000, 64, ATTN_F32);
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 1, 1, 5, 3000, 37, ATTN_F16);
  p.causal = 1;
  p.wl = 100;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 4, 1, 1, 1500, 128, ATTN_BF16);
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 1, 1, 70, 1100, 16, ATTN_F32);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(2, 2, 2, 3, 4100, 8, ATTN_F32);
  p.wl = 0;
  p.wr = 600;
  p.stats = 1;
  ps[n++] = p;
  static const int64_t ds[] = {1, 37, 64, 80, 128, 256};
  for (int i = 0; i < 6; i++) {
    p = tprob_make(1, 2, 1, 65 + 48 * i, 65 + 48 * i, ds[i], i % 2 ? ATTN_F16 : ATTN_BF16);
    p.causal = i % 3 == 0;
    p.stats = 1;
    ps[n++] = p;
  }
  return n;
}

int tcases_masked_rows(tprob *ps) {
  ps[0] = tprob_make(1, 2, 1, 100, 30, 64, ATTN_F32);
  ps[0].causal = true; /* rows 0..69 see nothing */
  ps[1] = tprob_make(1, 1, 1, 40, 40, 37, ATTN_BF16);
  ps[1].wl = 0;
  ps[1].wr = 0; /* the diagonal only: nothing masked fully, one key each */
  ps[2] = tprob_make(1, 1, 1, 70, 5, 16, ATTN_F16);
  ps[2].causal = true;
  ps[2].wl = 2;
  for (int i = 0; i < 3; i++)
    ps[i].stats = true;
  return 3;
}

/* Decoding: few query rows per (batch, KV head) over enough keys that they
 * are split across threads; GQA and MQA, masks and windows that leave
 * whole chunks invisible, every dtype, odd head_dim. */
int tcases_decode(tprob *ps) {
  static const int64_t hs[][2] = {{4, 4}, {8, 2}, {16, 1}}; /* MHA, GQA 4:1, MQA */
  static const int64_t win[][3] = {{0, -1, -1}, {1, -1, -1}, {1, 700, -1}, {0, 40, 3000}};
  int n = 0;
  for (int64_t nq = 1; nq <= 4; nq++)
    for (int h = 0; h < 3; h++) {
      const int w = (int)((nq + h) % 4);
      tprob p = tprob_make(1 + (nq == 2), hs[h][0], hs[h][1], nq, 1024 + 700 * nq + 37 * h,
                           (nq + h) % 3 ? 128 : 37, (attn_dtype)((nq + h) % 3));
      p.causal = win[w][0];
      p.wl = win[w][1];
      p.wr = win[w][2];
      p.stats = true;
      p.strided = nq == 3;
      ps[n++] = p;
    }
  return n;
}

int tcases_variants(tprob *ps) {
  /* b, hq, hkv, nq, nkv, d, causal, wl, wr, softcap, alibi */
  static const struct {
    int64_t b, hq, hkv, nq, nkv, d;
    bool causal;
    int64_t wl, wr;
    double softcap;
    int alibi;
  } v[] = {
      {1, 4, 2, 200, 200, 64, false, -1, -1, 2.0, 0}, /* softcap on tanh's curve */
      {2, 2, 2, 77, 130, 37, true, -1, -1, 0.5, 0},   /* hard cap, odd D, cross */
      {1, 8, 8, 150, 150, 128, true, -1, -1, 0, 1},   /* ALiBi [Hq], causal */
      {3, 4, 1, 65, 90, 80, false, -1, -1, 0, 2},     /* ALiBi [B, Hq], MQA, both sides */
      {2, 6, 2, 129, 70, 64, true, -1, -1, 30.0, 2},  /* both; Nq > Nkv: rows see nothing */
      {1, 4, 4, 300, 333, 96, false, 40, 7, 1.5, 1},  /* both in a window */
      {1, 8, 2, 1, 3000, 128, false, -1, -1, 3.0, 2}, /* decode, keys split */
      {2, 16, 4, 3, 2500, 64, true, 900, -1, 0, 1},   /* decode rows, ALiBi, window */
      {1, 4, 1, 4, 2000, 128, false, -1, -1, 1.0, 1}, /* group of 4 decode rows */
  };
  int n = 0;
  for (size_t i = 0; i < sizeof v / sizeof *v; i++)
    for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++) {
      tprob p = tprob_make(v[i].b, v[i].hq, v[i].hkv, v[i].nq, v[i].nkv, v[i].d, (attn_dtype)dt);
      p.causal = v[i].causal;
      p.wl = v[i].wl;
      p.wr = v[i].wr;
      p.softcap = v[i].softcap;
      p.alibi = v[i].alibi;
      p.stats = true;
      p.strided = i % 3 == 1;
      if (i == 5)
        p.scale = 0.3;
      ps[n++] = p;
    }
  return n;
}

/* Explicit diag_offset; see cases.h. */
int tcases_diag(tprob *ps) {
  static const int64_t nn[][2] = {{64, 1000}, {1000, 64}, {65, 65}, {7, 300}, {200, 33}};
  static const int64_t cfg[][4] = {/* diag, causal, left, right */
                                   {0, 1, -1, -1},    {-5, 1, -1, -1},  {17, 0, 3, 5},
                                   {-40, 0, 10, 0},   {100, 1, 40, -1}, {-3000, 0, -1, -1},
                                   {3000, 1, -1, -1}, {-70, 1, 20, -1}};
  int n = 0;
  for (size_t i = 0; i < sizeof nn / sizeof *nn; i++)
    for (size_t w = 0; w < sizeof cfg / sizeof *cfg; w++) {
      tprob p = tprob_make(1 + (i == 2), 4, 2, nn[i][0], nn[i][1], (i + w) % 2 ? 64 : 37,
                           (attn_dtype)((i + w) % 3));
      p.diag = cfg[w][0];
      p.causal = cfg[w][1];
      p.wl = cfg[w][2];
      p.wr = cfg[w][3];
      p.stats = true;
      p.strided = w == 2;
      ps[n++] = p;
    }
  /* a decode step whose keys the CPU splits, top-left and shifted */
  for (int64_t d = -1; d <= 1; d++) {
    tprob p = tprob_make(1, 8, 2, 2, 2500, 128, ATTN_F32);
    p.diag = d * 900;
    p.causal = true;
    p.stats = true;
    ps[n++] = p;
  }
  return n;
}
