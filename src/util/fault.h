/* Failure injection: the library can make its own calls fail on purpose, so
 * that tests can prove that every failure is an error with a detail, never a
 * crash, a hang or a leak.
 *
 * A site is one call the library makes that can fail: an allocation (every
 * allocation of the library goes through the seam below), a backend call
 * (named by its operation: "memcpy", "malloc", ...), a thread creation. Each
 * kind of site counts its calls; a spec says which calls fail:
 *
 *   alloc:17            the 17th allocation fails (counted from 1)
 *   alloc:17+           the 17th and every later allocation fail
 *   backend:memcpy:3    the 3rd backend call of operation "memcpy" fails
 *   backend:launch:2=devlost  ... and fails as a lost device would
 *   backend:5           the 5th backend call, whatever its operation
 *   thread:2            the 2nd thread creation fails
 *   seed:S@p:0.01       every site fails with probability 0.01, drawn from
 *                       seed S (the same seed fails the same calls)
 *   device:2@after:100  device 2 is lost after its 100th operation
 *   stall:barrier_release@us:300
 *                       every pass at the stall point of that name sleeps
 *                       300 us: a window between two steps of a protocol
 *                       widened, so that a test sees what another thread
 *                       can do in it (the points: mgpu__fault_stall calls)
 *
 * Several rules are separated by commas. The spec comes from MGPU_FAULT
 * (read once at init) or from mgpu__fault_set (tests). Counting starts with
 * the first mgpu__fault_set (a clearing one too) and then costs one relaxed
 * atomic add per site, so a sweep can first run a workload with no rule,
 * read the count of sites, then fail each in turn; before it a site reads
 * one flag.
 *
 * Threads: every function may be called from any thread at any time. The
 * counters and the rules are atomics; a spec set while other threads are at
 * sites takes effect for each of them at its next site. */
#ifndef MGPU_UTIL_FAULT_H
#define MGPU_UTIL_FAULT_H

#include <stddef.h>
#include <stdint.h>

typedef enum mgpu__fault_kind {
  MGPU__FAULT_ALLOC,
  MGPU__FAULT_BACKEND,
  MGPU__FAULT_THREAD,
  MGPU__FAULT_KINDS
} mgpu__fault_kind;

/* The most rules one spec holds, and the longest backend operation name. */
#define MGPU__FAULT_MAX_RULES 16
#define MGPU__FAULT_OP_MAX 24

/* Replaces the rules with those of spec (NULL or "" clears them) and resets
 * every counter to 0. Returns 0, or MGPU_EINVAL with the rules cleared and a
 * message naming the bad rule in why (why_size bytes; why may be NULL). */
int mgpu__fault_set(const char *spec, char *why, size_t why_size);

/* What mgpu__fault_hit says: go on (0), fail (MGPU__FAULT_FAIL), or fail
 * as a device that was lost (MGPU__FAULT_LOSE: a backend rule ending in
 * "=devlost"; the backend seam marks the call's device lost). */
#define MGPU__FAULT_FAIL 1
#define MGPU__FAULT_LOSE 2

/* Counts one call at a site of the kind (op: the backend operation, or NULL)
 * and says whether it must fail (nonzero, above) or go on (0). */
int mgpu__fault_hit(mgpu__fault_kind kind, const char *op);

/* Calls counted at sites of the kind since the last mgpu__fault_set, and how
 * many of them were made to fail. */
uint64_t mgpu__fault_calls(mgpu__fault_kind kind);
uint64_t mgpu__fault_fired(mgpu__fault_kind kind);

/* Counts one operation on device dev; returns 1 when a "device:dev@after:K"
 * rule says the device is lost from this operation on (the K+1th and later),
 * else 0. */
int mgpu__fault_device_op(int dev);

/* A stall point named name (a static string of [a-z0-9_]): sleeps as a
 * "stall:name@us:U" rule says, else returns at once (one load when no rule
 * is set). */
void mgpu__fault_stall(const char *name);
/* Stalls begun since the last mgpu__fault_set (counted before each
 * sleeps: a test waits for it to know a thread is in the window). */
uint64_t mgpu__fault_stalls(void);

/* "alloc", "backend" or "thread". */
const char *mgpu__fault_kind_name(mgpu__fault_kind kind);

/* Whether any rule is set (1) or none (0). */
int mgpu__fault_armed(void);

/* The allocation seam: every allocation of the library goes through these, so
 * that each is a site of kind MGPU__FAULT_ALLOC. They behave as the C library
 * calls they name (a NULL from malloc(0) aside: mgpu__malloc(0) returns a
 * unique pointer or NULL, as malloc may). mgpu__free(NULL) does nothing;
 * mgpu__aligned_alloc takes any size (it rounds up to the alignment) and its
 * memory is released with mgpu__free. */
void *mgpu__malloc(size_t size);
void *mgpu__calloc(size_t count, size_t size);
void *mgpu__realloc(void *ptr, size_t size);
void *mgpu__aligned_alloc(size_t align, size_t size);
char *mgpu__strdup(const char *s);
void mgpu__free(void *ptr);

#endif /* MGPU_UTIL_FAULT_H */
