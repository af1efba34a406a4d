/* A small JSON reader: parses a whole text into a tree the caller frees
 * with json_free. Enough for trace files and benchmark output: numbers are
 * doubles, strings are decoded (\uXXXX to UTF-8), objects keep their keys
 * in order. Used by `mgpu trace view` and by the tests that read what mgpu
 * writes. */
#ifndef MGPU_TOOLS_JSON_H
#define MGPU_TOOLS_JSON_H

#include <stddef.h>

typedef enum json_type {
  JSON_NULL,
  JSON_BOOL,
  JSON_NUMBER,
  JSON_STRING,
  JSON_ARRAY,
  JSON_OBJECT
} json_type;

typedef struct json json;
struct json {
  json_type type;
  double number;   /* JSON_NUMBER; JSON_BOOL: 0 or 1 */
  char *string;    /* JSON_STRING */
  size_t n;        /* JSON_ARRAY, JSON_OBJECT: number of items */
  json *items;     /* the items */
  char **keys;     /* JSON_OBJECT: keys[i] names items[i] */
};

/* Parses text (len bytes, need not end in NUL). Returns the tree, owned by
 * the caller, or NULL with a message naming the byte offset in err. */
json *json_parse(const char *text, size_t len, char *err, size_t err_size);

/* Reads and parses a file; NULL with the reason in err. */
json *json_parse_file(const char *path, char *err, size_t err_size);

void json_free(json *j);

/* The item of object j under key, or NULL (also when j is not an object). */
const json *json_get(const json *j, const char *key);
/* The number under key, or dflt when missing or not a number. */
double json_get_number(const json *j, const char *key, double dflt);
/* The string under key, or NULL. */
const char *json_get_string(const json *j, const char *key);

#endif /* MGPU_TOOLS_JSON_H */
