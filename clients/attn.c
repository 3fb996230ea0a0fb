/*
 * attn.c — the attn command: one binary, a subcommand per job.
 *
 * The subcommands work in-process on the engine: `plan` (memory of standard
 * versus flash attention), `bench` (GFLOP/s of the CPU engine) and `compute`
 * (a safetensors request file to a reply file); `infer`, `load` and
 * `session` (its server-held KV caches) are clients of a running attnd.
 * Exit status: 0 success, 1 run-time failure, 2 bad usage or input.
 */
#include "cmds.h"
#include "engine.h"

#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: attn <command> [options]\n"
    "\n"
    "commands:\n"
    "  plan    memory of standard vs flash attention for a shape (attn plan --help)\n"
    "  bench   GFLOP/s of the CPU flash engine (attn bench --help)\n"
    "  compute attention of a safetensors file, in-process (attn compute --help)\n"
    "  infer   send one request to an attnd server, optionally checked (attn infer --help)\n"
    "  load    load generator: closed or open loop, latency percentiles (attn load --help)\n"
    "  session a server-held KV cache: create, get, delete, truncate, fork, attend (attn "
    "session --help)\n"
    "\n"
    "attn --version prints the version.\n";

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage, stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    fputs(usage, stdout);
    return 0;
  }
  if (strcmp(cmd, "--version") == 0) {
    printf("attn %s\n", ATTN_VERSION);
    return 0;
  }
  if (strcmp(cmd, "plan") == 0)
    return tool_cmd_plan(argc - 1, argv + 1);
  if (strcmp(cmd, "bench") == 0)
    return tool_cmd_bench(argc - 1, argv + 1);
  if (strcmp(cmd, "compute") == 0)
    return tool_cmd_compute(argc - 1, argv + 1);
  if (strcmp(cmd, "infer") == 0)
    return tool_cmd_infer(argc - 1, argv + 1);
  if (strcmp(cmd, "load") == 0)
    return tool_cmd_load(argc - 1, argv + 1);
  if (strcmp(cmd, "session") == 0)
    return tool_cmd_session(argc - 1, argv + 1);
  fprintf(stderr, "attn: unknown command \"%s\"\n%s", cmd, usage);
  return 2;
}
