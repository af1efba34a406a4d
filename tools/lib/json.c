/* The JSON reader (json.h): recursive descent over the text, with a depth
 * limit so that a hostile file cannot exhaust the stack. */
#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct parser {
  const char *s;
  size_t len, pos;
  char *err;
  size_t err_size;
  int failed;
} parser;

static int fail(parser *p, const char *what) {
  if (!p->failed)
    snprintf(p->err, p->err_size, "%s at byte %zu", what, p->pos);
  p->failed = 1;
  return -1;
}

static void skip_space(parser *p) {
  while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\n' ||
                             p->s[p->pos] == '\r' || p->s[p->pos] == '\t'))
    p->pos++;
}

static int literal(parser *p, const char *word) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
    return fail(p, "unexpected word");
  p->pos += n;
  return 0;
}

static int hex4(parser *p, unsigned *out) {
  if (p->len - p->pos < 4) return fail(p, "short \\u escape");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p->s[p->pos++];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return fail(p, "bad \\u escape");
  }
  *out = v;
  return 0;
}

static size_t put_utf8(char *out, unsigned cp) {
  if (cp < 0x80) { out[0] = (char)cp; return 1; }
  if (cp < 0x800) {
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xe0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  out[0] = (char)(0xf0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
  out[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* Parses a string at p->pos (on the opening quote) into a new buffer. */
static int string(parser *p, char **out) {
  p->pos++;
  size_t start = p->pos, n = 0;
  /* The decoded string is never longer than the text. */
  while (p->pos < p->len && p->s[p->pos] != '"') {
    if (p->s[p->pos] == '\\') p->pos++;
    p->pos++;
  }
  if (p->pos >= p->len) return fail(p, "unterminated string");
  char *buf = malloc(p->pos - start + 1);
  if (buf == NULL) return fail(p, "out of memory");
  p->pos = start;
  while (p->s[p->pos] != '"') {
    char c = p->s[p->pos++];
    if ((unsigned char)c < 0x20) {
      free(buf);
      return fail(p, "control character in string");
    }
    if (c != '\\') {
      buf[n++] = c;
      continue;
    }
    c = p->s[p->pos++];
    switch (c) {
      case '"': case '\\': case '/': buf[n++] = c; break;
      case 'b': buf[n++] = '\b'; break;
      case 'f': buf[n++] = '\f'; break;
      case 'n': buf[n++] = '\n'; break;
      case 'r': buf[n++] = '\r'; break;
      case 't': buf[n++] = '\t'; break;
      case 'u': {
        unsigned cp;
        if (hex4(p, &cp) != 0) { free(buf); return -1; }
        if (cp >= 0xd800 && cp < 0xdc00 && p->len - p->pos >= 6 &&
            p->s[p->pos] == '\\' && p->s[p->pos + 1] == 'u') {
          unsigned lo;
          p->pos += 2;
          if (hex4(p, &lo) != 0) { free(buf); return -1; }
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        n += put_utf8(buf + n, cp);
        break;
      }
      default:
        free(buf);
        return fail(p, "bad escape");
    }
  }
  p->pos++;
  buf[n] = '\0';
  *out = buf;
  return 0;
}

static int value(parser *p, json *out, int depth);

static int push(parser *p, json *j, json *item, char *key) {
  if ((j->n & (j->n - 1)) == 0) { /* grow at powers of two */
    size_t cap = j->n ? 2 * j->n : 1;
    json *items = realloc(j->items, cap * sizeof *items);
    if (items == NULL) return fail(p, "out of memory");
    j->items = items;
    if (j->type == JSON_OBJECT) {
      char **keys = realloc(j->keys, cap * sizeof *keys);
      if (keys == NULL) return fail(p, "out of memory");
      j->keys = keys;
    }
  }
  j->items[j->n] = *item;
  if (j->type == JSON_OBJECT) j->keys[j->n] = key;
  j->n++;
  return 0;
}

static void clear(json *j);

static int container(parser *p, json *out, int depth, char close) {
  out->type = close == ']' ? JSON_ARRAY : JSON_OBJECT;
  p->pos++;
  skip_space(p);
  if (p->pos < p->len && p->s[p->pos] == close) {
    p->pos++;
    return 0;
  }
  for (;;) {
    char *key = NULL;
    json item = {0};
    skip_space(p);
    if (close == '}') {
      if (p->pos >= p->len || p->s[p->pos] != '"') return fail(p, "expected a key");
      if (string(p, &key) != 0) return -1;
      skip_space(p);
      if (p->pos >= p->len || p->s[p->pos] != ':') {
        free(key);
        return fail(p, "expected ':'");
      }
      p->pos++;
    }
    if (value(p, &item, depth + 1) != 0 || push(p, out, &item, key) != 0) {
      free(key);
      clear(&item);
      return -1;
    }
    skip_space(p);
    if (p->pos < p->len && p->s[p->pos] == ',') {
      p->pos++;
      continue;
    }
    if (p->pos < p->len && p->s[p->pos] == close) {
      p->pos++;
      return 0;
    }
    return fail(p, close == ']' ? "expected ',' or ']'" : "expected ',' or '}'");
  }
}

static int value(parser *p, json *out, int depth) {
  memset(out, 0, sizeof *out);
  if (depth > MAX_DEPTH) return fail(p, "nested too deep");
  skip_space(p);
  if (p->pos >= p->len) return fail(p, "unexpected end");
  char c = p->s[p->pos];
  switch (c) {
    case '{': return container(p, out, depth, '}');
    case '[': return container(p, out, depth, ']');
    case '"': out->type = JSON_STRING; return string(p, &out->string);
    case 't': out->type = JSON_BOOL; out->number = 1; return literal(p, "true");
    case 'f': out->type = JSON_BOOL; return literal(p, "false");
    case 'n': out->type = JSON_NULL; return literal(p, "null");
    default: break;
  }
  if (c != '-' && (c < '0' || c > '9')) return fail(p, "unexpected character");
  char num[64];
  size_t n = 0;
  while (p->pos < p->len && n < sizeof num - 1 &&
         strchr("+-.eE0123456789", p->s[p->pos]) != NULL)
    num[n++] = p->s[p->pos++];
  num[n] = '\0';
  char *end;
  errno = 0;
  out->type = JSON_NUMBER;
  out->number = strtod(num, &end);
  if (*end != '\0' || n == 0) return fail(p, "bad number");
  return 0;
}

static void clear(json *j) {
  if (j == NULL) return;
  free(j->string);
  for (size_t i = 0; i < j->n; i++) {
    clear(&j->items[i]);
    if (j->keys != NULL) free(j->keys[i]);
  }
  free(j->items);
  free(j->keys);
}

void json_free(json *j) {
  clear(j);
  free(j);
}

json *json_parse(const char *text, size_t len, char *err, size_t err_size) {
  parser p = {text, len, 0, err, err_size, 0};
  json *j = calloc(1, sizeof *j);
  if (j == NULL) {
    snprintf(err, err_size, "out of memory");
    return NULL;
  }
  if (value(&p, j, 0) == 0) {
    skip_space(&p);
    if (p.pos == p.len) return j;
    fail(&p, "text after the value");
  }
  json_free(j);
  return NULL;
}

json *json_parse_file(const char *path, char *err, size_t err_size) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    snprintf(err, err_size, "%s: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (buf == NULL) break;
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap) break;
    char *grown = realloc(buf, cap * 2);
    if (grown == NULL) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = grown;
    cap *= 2;
  }
  int bad = ferror(f);
  fclose(f);
  if (buf == NULL || bad) {
    snprintf(err, err_size, "%s: %s", path, buf ? "read error" : "out of memory");
    free(buf);
    return NULL;
  }
  json *j = json_parse(buf, n, err, err_size);
  free(buf);
  return j;
}

const json *json_get(const json *j, const char *key) {
  if (j == NULL || j->type != JSON_OBJECT) return NULL;
  for (size_t i = 0; i < j->n; i++)
    if (strcmp(j->keys[i], key) == 0) return &j->items[i];
  return NULL;
}

double json_get_number(const json *j, const char *key, double dflt) {
  const json *v = json_get(j, key);
  return v != NULL && v->type == JSON_NUMBER ? v->number : dflt;
}

const char *json_get_string(const json *j, const char *key) {
  const json *v = json_get(j, key);
  return v != NULL && v->type == JSON_STRING ? v->string : NULL;
}
