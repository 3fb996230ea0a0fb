/*
 * route.h — what one route is: a row of the route table (routes.h). The
 * request keeps a pointer to its row; only routes.c holds the rows.
 */
#ifndef ATTND_ROUTE_H
#define ATTND_ROUTE_H

#include "engine.h"

#include <stdbool.h>

struct attnd_req;
struct attnd_kind;

/* The methods a route answers, a bit each; GET also answers HEAD. */
enum { ATTND_GET = 1, ATTND_POST = 2, ATTND_PUT = 4, ATTND_DELETE = 8 };

typedef struct attnd_route {
  unsigned methods;
  /* The path, exactly; "{model}" stands for a model of the inference
   * protocol (attn_proto_v2_model), optionally followed by
   * "/versions/1", "{session}" for one path segment (a session's id,
   * checked by its handler), and "{console}" for any of the console's
   * files. */
  const char *pattern;
  bool open; /* served without the API key (probes, the console) */
  /* What it computes (kind.h), for a POST that queues engine work,
   * answered by the loop; NULL for every other route. */
  const struct attnd_kind *kind;
  /* Its series in the metrics; NULL: the path itself. */
  const char *label;
  /* How the 404 text of its part of the API (/v2 or the rest) names it, or
   * NULL for a route another row's words cover. */
  const char *hint;
  /* Answers the route on the HTTP thread; NULL for one that computes. */
  void (*answer)(struct attnd_req *r);
  /* Answers the route on the HTTP thread once its body is in (a session's
   * create or truncate: a small JSON body and no compute); for the
   * methods of body_methods, the others going to answer. */
  void (*after_body)(struct attnd_req *r);
  unsigned body_methods;
} attnd_route;

#endif
