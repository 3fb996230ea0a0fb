/*
 * config_usage.c — attnd --help: the usage text made from the flag table,
 * and each flag's environment variable (ATTND_ and its name in capitals,
 * '-' as '_').
 */
#include "config_int.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* The usage's layout: a flag and its argument in the first column, the
 * help wrapped in the second. */
enum { USAGE_INDENT = 2, USAGE_COLUMN = 25, USAGE_WIDTH = 86 };

void attnd__flag_env(const attnd__flag *f, char *out, size_t cap) {
  size_t n = (size_t)snprintf(out, cap, "ATTND_%s", f->name);
  for (size_t i = 0; i < n && i < cap; i++)
    out[i] = out[i] == '-' ? '_' : (char)toupper((unsigned char)out[i]);
}

/* Prints text from column `at`, wrapped at USAGE_WIDTH onto lines that
 * start at USAGE_COLUMN. */
static void print_wrapped(FILE *out, const char *text, int at) {
  bool first = true;
  while (*text) {
    size_t w = strcspn(text, " ");
    if (!first && at + 1 + (int)w > USAGE_WIDTH) {
      fprintf(out, "\n%*s", USAGE_COLUMN, "");
      at = USAGE_COLUMN;
    } else if (!first) {
      fputc(' ', out);
      at++;
    }
    first = false;
    fwrite(text, 1, w, out);
    at += (int)w;
    text += w;
    text += *text == ' ';
  }
  fputc('\n', out);
}

static void print_flag(FILE *out, const attnd__flag *f) {
  char head[64], env[64], text[640];
  int n = snprintf(head, sizeof head, "--%s %s", f->name, f->arg);
  attnd__flag_env(f, env, sizeof env);
  snprintf(text, sizeof text, "%s (%s) [%s]", f->help, *f->def ? f->def : "none", env);
  /* A head one column too wide still fits when the help starts a column
   * later; a longer one gets a line of its own. */
  int at = USAGE_COLUMN;
  if (n <= USAGE_COLUMN - USAGE_INDENT) {
    fprintf(out, "%*s%-*s ", USAGE_INDENT, "", USAGE_COLUMN - USAGE_INDENT - 1, head);
    at = USAGE_INDENT +
         (n > USAGE_COLUMN - USAGE_INDENT - 1 ? n : USAGE_COLUMN - USAGE_INDENT - 1) + 1;
  } else {
    fprintf(out, "%*s%s\n%*s", USAGE_INDENT, "", head, USAGE_COLUMN, "");
  }
  print_wrapped(out, text, at);
}

void attnd__config_usage(FILE *out, const attnd__flag *flags, int n) {
  fputs("usage: attnd [options]\n"
        "\n"
        "Serves exact attention (FlashAttention) over HTTP: POST /attention with q, k, v\n"
        "as JSON or safetensors; POST /attention/backward with q, k, v, o, do [, lse] for\n"
        "dq, dk, dv; GET /attention/plan, /healthz, /readyz, /metrics, /v1/info.\n"
        "\n"
        "options (environment fallback in brackets):\n",
        out);
  for (int i = 0; i < n; i++)
    print_flag(out, &flags[i]);
  fputs("  --help, --version\n"
        "\n"
        "Memory is bounded by max-queue x max-body for request bodies, plus the replies,\n"
        "and by session-memory for sessions.\n"
        "SIGTERM or SIGINT drains (finishes what was accepted; after drain-delay, if set)\n"
        "and exits 0. SIGHUP and SIGUSR1 are logged and ignored: attnd reloads nothing\n"
        "(restart it to apply changes).\n",
        out);
}
