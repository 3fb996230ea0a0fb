/*
 * routes.h — the one table of what attnd serves (routes.c): each route's
 * methods, path pattern, whether it is open without the API key, whether it
 * computes, its metrics label, its words in the 404 text and its handler.
 * Routing, the key check, the metrics, the console and the 404 and 405
 * replies all read it; a new route is a row and a handler, or for one that
 * computes, a row and a kind (kind.h).
 */
#ifndef ATTND_ROUTES_H
#define ATTND_ROUTES_H

#include "request.h"
#include "route.h"

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

/* The table's metrics labels, each once, in table order, up to cap of them
 * (their static strings into out); returns how many there are. */
int attnd_route_labels(const char **out, int cap);

/* Where route's label is among attnd_route_labels()' (the metrics' series
 * of the route, attnd_metrics_request_series), or -1 for a route without
 * a label (the console's). Numbered once, from the table: no string is
 * compared per request. */
int attnd_route_series(const attnd_route *route);

/* Whether method is one route answers. */
bool attnd_route_allows(const attnd_route *route, const char *method);

/* Whether route reads method's body before answering it (after_body). */
bool attnd_route_body_first(const attnd_route *route, const char *method);

/* The Allow header of a 405 on route ("POST", "GET, HEAD", ...). */
const char *attnd_route_allow(const attnd_route *route);

/* Sets r's 404 (no route for its path) or 405 (its route answers other
 * methods), the message naming what there is. */
void attnd_route_not_found(attnd_req *r);
void attnd_route_not_allowed(attnd_req *r);

/* Whether r is a call of a session route whose path was sent with a '%':
 * then r has its 422. Ids are plain characters, and a proxy in front
 * routes by the path as sent: decoded, one id would have two spellings
 * ("dup%2D1", "dup-1") and "%5Fbatch" would pass for "_batch". */
bool attnd_route_escaped(attnd_req *r);

#endif
