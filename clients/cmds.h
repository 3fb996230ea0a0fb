/*
 * cmds.h — the subcommands of build/attn; each returns the process's exit
 * status (0 success, 1 failure at run time, 2 bad usage or input).
 */
#ifndef TOOL_CMDS_H
#define TOOL_CMDS_H

int tool_cmd_plan(int argc, char **argv);
int tool_cmd_bench(int argc, char **argv);
int tool_cmd_compute(int argc, char **argv);
int tool_cmd_infer(int argc, char **argv);
int tool_cmd_load(int argc, char **argv);
int tool_cmd_session(int argc, char **argv);

#endif
