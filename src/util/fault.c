/* Failure injection and the allocation seam: see fault.h.
 *
 * Each kind of site has an atomic counter that every call bumps, armed or
 * not, once a spec was first set (counting; before, a site reads that flag
 * and nothing else: the counters are words that every thread would write,
 * and a line that moves between cores at every backend call costs a
 * program that never injects a fault). With no rule set that is all a site
 * costs. With rules set, a site
 * takes one mutex to match them (rules hold their own counters for
 * per-operation and per-device matching): rules are only set by tests and by
 * MGPU_FAULT, where correctness matters and speed does not. */
#include "util/fault.h"
#include "util/thread.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mgpu/error.h"

typedef enum rule_type {
  RULE_NTH,
  RULE_RANDOM,
  RULE_DEVICE,
  RULE_STALL
} rule_type;

typedef struct fault_rule {
  rule_type type;
  mgpu__fault_kind kind;        /* RULE_NTH */
  char op[MGPU__FAULT_OP_MAX];  /* RULE_NTH on backend: "" matches every op;
                                   RULE_STALL: the stall point */
  uint64_t nth;                 /* RULE_NTH: the call that fails (from 1) */
  int from_on;                  /* RULE_NTH: that call and every later one */
  int lose;                     /* RULE_NTH on backend ("=devlost"): the
                                   failure is a lost device */
  uint64_t seed, threshold;     /* RULE_RANDOM: fails when hash < threshold */
  int device;                   /* RULE_DEVICE */
  uint64_t after;               /* RULE_DEVICE: operations before the loss;
                                   RULE_STALL: microseconds of each stall */
  uint64_t matched;             /* calls this rule has seen (under rules_lock) */
} fault_rule;

static const char *const kind_names[MGPU__FAULT_KINDS] = {"alloc", "backend",
                                                          "thread"};

/* rules_lock guards rules and rule_count; armed mirrors rule_count != 0 so
 * that an unarmed site never takes the lock. */
static mgpu__mutex rules_lock = MGPU__MUTEX_INITIALIZER(MGPU__LOCK_FAULT_RULES);
static fault_rule rules[MGPU__FAULT_MAX_RULES];
static int rule_count;
static atomic_int armed;
static atomic_int counting; /* set by the first mgpu__fault_set */
static _Atomic uint64_t calls[MGPU__FAULT_KINDS];
static _Atomic uint64_t fired[MGPU__FAULT_KINDS];
static _Atomic uint64_t stalls;

static void say(char *why, size_t why_size, const char *fmt, ...) {
  if (why == NULL || why_size == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, why_size, fmt, ap);
  va_end(ap);
}

/* A decimal count of at least min, the whole of [s, end). */
static int parse_count(const char *s, const char *end, uint64_t min,
                       uint64_t *out) {
  if (s == end || *s < '0' || *s > '9') return -1;
  uint64_t v = 0;
  for (; s < end; s++) {
    if (*s < '0' || *s > '9') return -1;
    unsigned digit = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - digit) / 10) return -1;
    v = v * 10 + digit;
  }
  if (v < min) return -1;
  *out = v;
  return 0;
}

/* "N" or "N+" at the end of a rule. */
static int parse_nth(const char *s, const char *end, fault_rule *r) {
  r->from_on = end > s && end[-1] == '+';
  return parse_count(s, r->from_on ? end - 1 : end, 1, &r->nth);
}

/* "seed:S@p:P", P a probability in [0, 1]. */
static int parse_random(const char *s, const char *end, fault_rule *r) {
  const char *at = memchr(s, '@', (size_t)(end - s));
  if (at == NULL || parse_count(s + 5, at, 0, &r->seed) != 0) return -1;
  if (end - at < 4 || strncmp(at, "@p:", 3) != 0) return -1;
  char text[32];
  size_t len = (size_t)(end - (at + 3));
  if (len == 0 || len >= sizeof text) return -1;
  memcpy(text, at + 3, len);
  text[len] = '\0';
  char *stop;
  errno = 0;
  double p = strtod(text, &stop);
  if (errno != 0 || *stop != '\0' || !(p >= 0.0 && p <= 1.0)) return -1;
  /* 2^64 * p, saturated: p = 1 fails every call. */
  r->threshold = p >= 1.0 ? UINT64_MAX : (uint64_t)(p * 18446744073709551616.0);
  r->type = RULE_RANDOM;
  return 0;
}

/* "device:N@after:K". */
static int parse_device(const char *s, const char *end, fault_rule *r) {
  const char *at = memchr(s, '@', (size_t)(end - s));
  uint64_t dev;
  if (at == NULL || parse_count(s + 7, at, 0, &dev) != 0 || dev > 65535)
    return -1;
  if (end - at < 8 || strncmp(at, "@after:", 7) != 0) return -1;
  if (parse_count(at + 7, end, 0, &r->after) != 0) return -1;
  r->device = (int)dev;
  r->type = RULE_DEVICE;
  return 0;
}

/* A name of [a-z0-9_] in [s, end), copied into op. */
static int parse_name(const char *s, const char *end, char *op, size_t size) {
  size_t len = (size_t)(end - s);
  if (len == 0 || len >= size) return -1;
  for (const char *c = s; c < end; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_'))
      return -1;
  memcpy(op, s, len);
  return 0;
}

/* "stall:NAME@us:U", U at most a second. */
static int parse_stall(const char *s, const char *end, fault_rule *r) {
  const char *at = memchr(s, '@', (size_t)(end - s));
  if (at == NULL || parse_name(s + 6, at, r->op, sizeof r->op) != 0) return -1;
  if (end - at < 5 || strncmp(at, "@us:", 4) != 0) return -1;
  if (parse_count(at + 4, end, 0, &r->after) != 0 || r->after > 1000000)
    return -1;
  r->type = RULE_STALL;
  return 0;
}

static int parse_rule(const char *s, const char *end, fault_rule *r) {
  memset(r, 0, sizeof *r);
  size_t len = (size_t)(end - s);
  if (len > 5 && strncmp(s, "seed:", 5) == 0) return parse_random(s, end, r);
  if (len > 7 && strncmp(s, "device:", 7) == 0) return parse_device(s, end, r);
  if (len > 6 && strncmp(s, "stall:", 6) == 0) return parse_stall(s, end, r);
  r->type = RULE_NTH;
  if (len > 6 && strncmp(s, "alloc:", 6) == 0) {
    r->kind = MGPU__FAULT_ALLOC;
    return parse_nth(s + 6, end, r);
  }
  if (len > 7 && strncmp(s, "thread:", 7) == 0) {
    r->kind = MGPU__FAULT_THREAD;
    return parse_nth(s + 7, end, r);
  }
  if (len > 8 && strncmp(s, "backend:", 8) == 0) {
    r->kind = MGPU__FAULT_BACKEND;
    const char *rest = s + 8;
    static const char lose[] = "=devlost";
    size_t lose_len = sizeof lose - 1;
    if ((size_t)(end - rest) > lose_len &&
        strncmp(end - lose_len, lose, lose_len) == 0) {
      r->lose = 1;
      end -= lose_len;
    }
    const char *colon = memchr(rest, ':', (size_t)(end - rest));
    if (colon == NULL) return parse_nth(rest, end, r); /* any operation */
    if (parse_name(rest, colon, r->op, sizeof r->op) != 0) return -1;
    return parse_nth(colon + 1, end, r);
  }
  return -1;
}

int mgpu__fault_set(const char *spec, char *why, size_t why_size) {
  fault_rule parsed[MGPU__FAULT_MAX_RULES];
  int n = 0, rc = 0;
  if (why != NULL && why_size > 0) why[0] = '\0';
  int more = spec != NULL && *spec != '\0';
  for (const char *s = spec; more;) {
    const char *end = strchr(s, ',');
    if (end == NULL) end = s + strlen(s);
    if (n == MGPU__FAULT_MAX_RULES) {
      say(why, why_size, "more than %d rules", MGPU__FAULT_MAX_RULES);
      rc = MGPU_EINVAL;
      break;
    }
    if (parse_rule(s, end, &parsed[n]) != 0) {
      say(why, why_size,
          "rule \"%.*s\" is not alloc:N[+], backend:[OP:]N[+][=devlost], "
          "thread:N[+], seed:S@p:P (0 <= P <= 1), device:D@after:K "
          "or stall:NAME@us:U (U <= 1000000)",
          (int)(end - s > 64 ? 64 : end - s), s);
      rc = MGPU_EINVAL;
      break;
    }
    n++;
    more = *end == ','; /* a comma promises another rule */
    s = end + more;
  }
  if (rc != 0) n = 0;
  mgpu__mutex_lock(&rules_lock);
  memcpy(rules, parsed, (size_t)n * sizeof *rules);
  rule_count = n;
  for (int k = 0; k < MGPU__FAULT_KINDS; k++) {
    atomic_store_explicit(&calls[k], 0, memory_order_relaxed);
    atomic_store_explicit(&fired[k], 0, memory_order_relaxed);
  }
  atomic_store(&stalls, 0);
  atomic_store_explicit(&counting, 1, memory_order_relaxed);
  atomic_store_explicit(&armed, n > 0, memory_order_release);
  mgpu__mutex_unlock(&rules_lock);
  return rc;
}

/* splitmix64: a good 64-bit mix of the seed and the call number. */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static int nth_matches(fault_rule *r, uint64_t count) {
  return r->from_on ? count >= r->nth : count == r->nth;
}

int mgpu__fault_hit(mgpu__fault_kind kind, const char *op) {
  if (!atomic_load_explicit(&counting, memory_order_relaxed)) return 0;
  uint64_t call =
      atomic_fetch_add_explicit(&calls[kind], 1, memory_order_relaxed) + 1;
  if (!atomic_load_explicit(&armed, memory_order_acquire)) return 0;
  int fail = 0;
  mgpu__mutex_lock(&rules_lock);
  for (int i = 0; i < rule_count; i++) {
    fault_rule *r = &rules[i];
    if (r->type == RULE_RANDOM) {
      uint64_t h = mix(r->seed ^ mix(((uint64_t)kind << 56) ^ call));
      if ((r->threshold == UINT64_MAX || h < r->threshold) && fail == 0)
        fail = MGPU__FAULT_FAIL;
    } else if (r->type == RULE_NTH && r->kind == kind) {
      int match = 0;
      if (r->op[0] == '\0')
        match = nth_matches(r, call);
      else if (op != NULL && strcmp(op, r->op) == 0)
        match = nth_matches(r, ++r->matched);
      if (match && r->lose) fail = MGPU__FAULT_LOSE;
      else if (match && fail == 0) fail = MGPU__FAULT_FAIL;
    }
  }
  mgpu__mutex_unlock(&rules_lock);
  if (fail) atomic_fetch_add_explicit(&fired[kind], 1, memory_order_relaxed);
  return fail;
}

int mgpu__fault_device_op(int dev) {
  if (!atomic_load_explicit(&armed, memory_order_acquire)) return 0;
  int lost = 0;
  mgpu__mutex_lock(&rules_lock);
  for (int i = 0; i < rule_count; i++) {
    fault_rule *r = &rules[i];
    if (r->type == RULE_DEVICE && r->device == dev && ++r->matched > r->after)
      lost = 1;
  }
  mgpu__mutex_unlock(&rules_lock);
  return lost;
}

void mgpu__fault_stall(const char *name) {
  if (!atomic_load_explicit(&armed, memory_order_acquire)) return;
  uint64_t us = 0;
  mgpu__mutex_lock(&rules_lock);
  for (int i = 0; i < rule_count; i++)
    if (rules[i].type == RULE_STALL && strcmp(rules[i].op, name) == 0)
      us = rules[i].after;
  mgpu__mutex_unlock(&rules_lock);
  if (us == 0) return;
  atomic_fetch_add(&stalls, 1);
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) continue;
}

uint64_t mgpu__fault_stalls(void) { return atomic_load(&stalls); }

uint64_t mgpu__fault_calls(mgpu__fault_kind kind) {
  return atomic_load_explicit(&calls[kind], memory_order_relaxed);
}

uint64_t mgpu__fault_fired(mgpu__fault_kind kind) {
  return atomic_load_explicit(&fired[kind], memory_order_relaxed);
}

int mgpu__fault_armed(void) {
  return atomic_load_explicit(&armed, memory_order_acquire);
}

/* The seam. Each call is one site; a failure looks exactly like the C
 * library's: NULL, with errno ENOMEM. */
static int alloc_fails(void) {
  if (!mgpu__fault_hit(MGPU__FAULT_ALLOC, NULL)) return 0;
  errno = ENOMEM;
  return 1;
}

void *mgpu__malloc(size_t size) {
  return alloc_fails() ? NULL : malloc(size);
}

void *mgpu__calloc(size_t count, size_t size) {
  return alloc_fails() ? NULL : calloc(count, size);
}

void *mgpu__realloc(void *ptr, size_t size) {
  return alloc_fails() ? NULL : realloc(ptr, size);
}

void *mgpu__aligned_alloc(size_t align, size_t size) {
  if (alloc_fails()) return NULL;
  if (align < sizeof(void *)) align = sizeof(void *);
  size_t rounded = (size + align - 1) & ~(align - 1);
  void *p = NULL;
  if (rounded < size || posix_memalign(&p, align, rounded == 0 ? align : rounded) != 0)
    return NULL;
  return p;
}

char *mgpu__strdup(const char *s) {
  if (alloc_fails()) return NULL;
  size_t len = strlen(s) + 1;
  char *copy = malloc(len);
  if (copy != NULL) memcpy(copy, s, len);
  return copy;
}

void mgpu__free(void *ptr) { free(ptr); }

const char *mgpu__fault_kind_name(mgpu__fault_kind kind) {
  return kind >= 0 && kind < MGPU__FAULT_KINDS ? kind_names[kind] : "?";
}
