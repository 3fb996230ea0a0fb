/*
 * cmds.h — the subcommands of build/attn; each returns the process's exit
 * status (0 success, 1 failure at run time, 2 bad usage or input).
 */
#ifndef ATTN_CMDS_H
#define ATTN_CMDS_H

int attn_cmd_plan(int argc, char **argv);
int attn_cmd_bench(int argc, char **argv);
int attn_cmd_compute(int argc, char **argv);
int attn_cmd_infer(int argc, char **argv);
int attn_cmd_load(int argc, char **argv);
int attn_cmd_session(int argc, char **argv);

#endif
