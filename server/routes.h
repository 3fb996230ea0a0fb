/*
 * routes.h — the one table of what attnd serves (routes.c): each route's
 * methods, path pattern, whether it is open without the API key, whether it
 * computes, its metrics label, its words in the 404 text and its handler.
 * Routing, the key check, the metrics, the console and the 404 and 405
 * replies all read it; a new route is a row and a handler.
 */
#ifndef ATTND_ROUTES_H
#define ATTND_ROUTES_H

#include "engine.h"
#include "request.h"

#include <stdbool.h>

/* The methods a route answers, a bit each; GET also answers HEAD. */
enum { ATTND_GET = 1, ATTND_POST = 2 };

typedef struct attnd_route {
  unsigned methods;
  /* The path, exactly; "{model}" stands for a model of the inference
   * protocol (attn_proto_v2_model), optionally followed by
   * "/versions/1", and "{console}" for any of the console's files. */
  const char *pattern;
  bool open;     /* served without the API key (probes, the console) */
  bool computes; /* a POST that queues engine work, answered by the loop */
  attn_pass pass;
  /* Its series in the metrics; NULL: the path itself. */
  const char *label;
  /* How the 404 text of its part of the API (/v2 or the rest) names it, or
   * NULL for a route another row's words cover. */
  const char *hint;
  /* Answers the route on the HTTP thread; NULL for one that computes. */
  void (*answer)(attnd_req *r);
} attnd_route;

/* The route whose pattern path matches (no query), or NULL. *model is the
 * model's index for a pattern with one (-1 otherwise), *asset the console's
 * file for "{console}"; either may be NULL. */
const attnd_route *attnd_route_find(const char *path, int *model,
                                    const attnd_console_asset **asset);

/* Whether path is in the inference protocol's part of the API (/v2...),
 * whose replies and 404s take that protocol's shape. */
bool attnd_route_v2(const char *path);

/* Routes r by its path (r->path set): r->route (NULL: none), and for /v2
 * the protocol's fields and the model label. */
void attnd_route_of(attnd_req *r);

/* Whether method is one route answers. */
bool attnd_route_allows(const attnd_route *route, const char *method);

/* The Allow header of a 405 on route ("POST" or "GET, HEAD"). */
const char *attnd_route_allow(const attnd_route *route);

/* Sets r's 404 (no route for its path) or 405 (its route answers other
 * methods), the message naming what there is. */
void attnd_route_not_found(attnd_req *r);
void attnd_route_not_allowed(attnd_req *r);

/* Whether a path is served without the key (auth.h). */
bool attnd_route_open(const char *path);

#endif
