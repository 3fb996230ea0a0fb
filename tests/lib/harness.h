/*
 * harness.h — black-box tests of attnd: start the real server binary as a
 * child process on a free port, talk HTTP to it (libcurl, or raw sockets for
 * what curl cannot do), build request bodies from the unit tests' random
 * problems (tests/lib/helpers.h) and check replies against the float64
 * reference.
 *
 * Each job has its module: harness_proc.h (the server process),
 * harness_http.h (libcurl), harness_raw.h (raw sockets), harness_bodies.h
 * (bodies and reply checks), harness_prom.h (/metrics and waiting on it),
 * harness_hold.h (attnd-hold, whose jobs wait for the test), harness_util.h
 * (clock, files). A test includes this header for all of them.
 */
#ifndef ATTND_TEST_HARNESS_H
#define ATTND_TEST_HARNESS_H

#include "harness_bodies.h"
#include "harness_hold.h"
#include "harness_http.h"
#include "harness_proc.h"
#include "harness_prom.h"
#include "harness_raw.h"
#include "harness_util.h"
#include "helpers.h"

#endif
