/* Configuration: the mgpu_config given to mgpu_init, completed from the
 * environment and then from the defaults. The environment is read here and
 * nowhere else: every variable that libmgpu, its modules and its tools read
 * is one line of `vars` below (name, meaning, default; for a config field
 * also its field, parser and bounds), which serves for the environment and
 * for checking the fields a caller set. Readers elsewhere ask by name
 * (mgpu__env, mgpu_module_getenv); a name without its line is refused. */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/core-internal.h"
#include "mgpu/module.h"

#define DEFAULT_HOST_MEM ((size_t)1 << 30)
#define DEFAULT_HOST_WORKERS 2
#define DEFAULT_STAGING_DEPTH 3
#define DEFAULT_TIMEOUT_MS 30000

int mgpu__parse_size(const char *s, size_t *out) {
  if (s == NULL || !isdigit((unsigned char)*s)) return MGPU_EINVAL;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0) return MGPU_EINVAL;
  unsigned shift = 0;
  switch (toupper((unsigned char)*end)) {
    case '\0': break;
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: return MGPU_EINVAL;
  }
  if (*end == 'i' || *end == 'I') end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0') return MGPU_EINVAL;
  if (shift && v > (~0ull >> shift)) return MGPU_EINVAL;
  *out = (size_t)(v << shift);
  return 0;
}

int mgpu_module_parse_size(const char *s, size_t *out) {
  return mgpu__parse_size(s, out);
}

static int parse_int_range(const char *s, int lo, int hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
    return MGPU_EINVAL;
  *out = (int)v;
  return 0;
}

int mgpu_module_parse_int(const char *s, int lo, int hi, int *out) {
  return parse_int_range(s, lo, hi, out);
}

/* The node-local rank (and, where it says, the node's rank count) from the
 * launcher's environment: Open MPI, Slurm, MPICH/Hydra, PMI. */
static int launcher_local_rank(mgpu__devspec_entry *e) {
  static const char *const rank_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK",
                                          "SLURM_LOCALID", "MPI_LOCALRANKID",
                                          "PMI_LOCAL_RANK"};
  static const char *const size_vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", NULL,
                                          "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"};
  for (int i = 0; i < 4; i++) {
    const char *v = mgpu__env(rank_vars[i]);
    if (v == NULL) continue;
    if (parse_int_range(v, 0, 1 << 20, &e->ordinal) != 0)
      return mgpu__error(MGPU_EINVAL, "MGPU_DEVICES=local: %s: bad value '%s' "
                         "(expected a local rank)", rank_vars[i], v);
    const char *sz = size_vars[i] ? mgpu__env(size_vars[i]) : NULL;
    if (sz == NULL || parse_int_range(sz, 1, 1 << 20, &e->local_size) != 0)
      e->local_size = 0;
    return 0;
  }
  return mgpu__error(MGPU_EINVAL, "MGPU_DEVICES=local: no launcher local rank "
                     "(OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, "
                     "MPI_LOCALRANKID or PMI_LOCAL_RANK) is set");
}

/* One token of MGPU_DEVICES: host[:N] | cuda[:K[/S]] | opencl[:K[/S]] |
 * local. */
static int parse_device_token(const char *tok, mgpu__devspec_entry *e) {
  memset(e, 0, sizeof *e);
  if (strcmp(tok, "local") == 0) {
    e->local = 1;
    e->split = 1;
    e->count = 1;
    return launcher_local_rank(e) == 0 ? 0 : 1;
  }
  const char *colon = strchr(tok, ':');
  size_t name_len = colon ? (size_t)(colon - tok) : strlen(tok);
  const char *rest = colon ? colon + 1 : NULL;
  if (name_len == 4 && strncmp(tok, "host", 4) == 0) {
    e->backend = MGPU_BACKEND_HOST;
    e->count = 4;
    if (rest != NULL && parse_int_range(rest, 1, MGPU_MAX_DEVICES, &e->count))
      return MGPU_EINVAL;
    return 0;
  }
  int is_cuda = name_len == 4 && strncmp(tok, "cuda", 4) == 0;
  int is_opencl = name_len == 6 && strncmp(tok, "opencl", 6) == 0;
  if (is_cuda || is_opencl) {
    e->backend = is_cuda ? MGPU_BACKEND_CUDA : MGPU_BACKEND_OPENCL;
    e->split = 1;
    if (rest == NULL) {
      e->all = 1;
      return 0;
    }
    char buf[32];
    if (strlen(rest) >= sizeof buf) return MGPU_EINVAL;
    strcpy(buf, rest);
    char *slash = strchr(buf, '/');
    if (slash != NULL) {
      *slash = '\0';
      if (parse_int_range(slash + 1, 1, MGPU_MAX_DEVICES, &e->split))
        return MGPU_EINVAL;
    }
    return parse_int_range(buf, 0, 1023, &e->ordinal);
  }
  return MGPU_EINVAL;
}

int mgpu__parse_devices(const char *spec, mgpu__devspec_entry *out, int max,
                        int *n) {
  *n = 0;
  const char *p = spec;
  while (1) {
    while (*p == ' ') p++;
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char tok[64];
    while (len > 0 && p[len - 1] == ' ') len--;
    if (len == 0 || len >= sizeof tok)
      return mgpu__error(MGPU_EINVAL,
                         "MGPU_DEVICES='%s': empty or overlong entry", spec);
    memcpy(tok, p, len);
    tok[len] = '\0';
    if (*n == max)
      return mgpu__error(MGPU_EINVAL, "MGPU_DEVICES='%s': more than %d entries",
                         spec, max);
    int prc = parse_device_token(tok, &out[*n]);
    if (prc > 0) return MGPU_EINVAL; /* the detail is written */
    if (prc != 0)
      return mgpu__error(MGPU_EINVAL,
                         "MGPU_DEVICES='%s': bad token '%s' (expected host:N, "
                         "cuda, cuda:K, cuda:K/S, opencl, opencl:K, "
                         "opencl:K/S or local; N and S from 1 to %d, K from 0 "
                         "to 1023)", spec, tok, MGPU_MAX_DEVICES);
    (*n)++;
    if (comma == NULL) return 0;
    p = comma + 1;
  }
}

/* ---- the variables ---- */

typedef enum var_kind {
  V_STRING, /* const char *, taken as it is */
  V_SIZE,   /* size_t, "512M", "2G"; at least lo, at most hi (0: no hi) */
  V_INT,    /* int, decimal, lo to hi */
  V_LOG,    /* int, none|warn|info|debug (or 0) */
  V_PEER    /* int, none|0 or all|1 */
} var_kind;

/* One environment variable: its name and meaning, and either its
 * mgpu_config field (field non-NULL: how it is parsed, its bounds, its
 * default) or, for a variable read by a module, a tool or a part of the
 * library outside mgpu_init, the text taken when it is unset (text_def,
 * NULL for none; the reader parses it). A field at or below `unset` (NULL
 * for strings) is taken from the environment, then from def. A value the
 * caller set in the field is held to the same bounds as one from the
 * environment. */
typedef struct config_var {
  const char *env;
  const char *field;
  size_t offset;
  var_kind kind;
  long long lo, hi; /* bounds of a set value (V_SIZE: hi 0 is none) */
  long long unset;  /* the field's value meaning "not set" */
  long long def;    /* the default; V_SIZE 0 leaves the field 0 */
  const char *expect;
  const char *text_def; /* not a field: the value when unset */
  const char *meaning;
} config_var;

#define VAR(env, field, kind, lo, hi, unset, def, expect, meaning)          \
  {env, #field, offsetof(mgpu_config, field), kind, lo, hi, unset, def,     \
   expect, NULL, meaning}
/* A variable that is not a field of mgpu_config. */
#define ENV(env, text_def, meaning) \
  {env, NULL, 0, V_STRING, 0, 0, 0, 0, NULL, text_def, meaning}

static const config_var vars[] = {
    VAR("MGPU_DEVICES", devices, V_STRING, 0, 0, 0, 0, NULL,
        "the devices to open (host:N, cuda[:K[/S]], opencl[:K[/S]], local)"),
    VAR("MGPU_HOST_MEM", host_mem, V_SIZE, 1, 0, 0, DEFAULT_HOST_MEM,
        "a size such as 512M or 2G", "memory of each host device"),
    VAR("MGPU_LOG", log_level, V_LOG, MGPU_LOG_NONE, MGPU_LOG_DEBUG, -1,
        MGPU_LOG_NONE, "none, warn, info or debug", "what the library logs"),
    VAR("MGPU_HOST_WORKERS", host_workers, V_INT, 1, 64, 0,
        DEFAULT_HOST_WORKERS, "1 to 64", "worker threads per host device"),
    VAR("MGPU_HOST_PEER", host_peer, V_PEER, 0, 1, -1, 1, "none or all",
        "whether host devices copy to each other directly"),
    /* staging_chunk left 0: the copy layer picks it per pair of devices. */
    /* A chunk of 1 byte cut a 1 MiB copy into a million pieces; 2G pinned
     * gigabytes per copy. */
    VAR("MGPU_STAGING_CHUNK", staging_chunk, V_SIZE,
        (long long)MGPU_STAGING_CHUNK_MIN, (long long)MGPU_STAGING_CHUNK_MAX,
        0, 0, "a size from 4K to 64M", "bytes per piece of a staged copy"),
    VAR("MGPU_STAGING_DEPTH", staging_depth, V_INT, 2, MGPU_STAGING_DEPTH_MAX,
        0, DEFAULT_STAGING_DEPTH, "2 to 64",
        "pieces of a staged copy in flight"),
    VAR("MGPU_PLUGIN_PATH", plugin_path, V_STRING, 0, 0, 0, 0, NULL,
        "where the CUDA plugin is looked for"),
    VAR("MGPU_CUDA_GREEN", cuda_green, V_INT, 0, 1, -1, 1, "0 or 1",
        "split CUDA devices with green contexts"),
    VAR("MGPU_CUDA_BUSY", cuda_busy, V_INT, 0, 1, -1, 1, "0 or 1",
        "time CUDA work with events for busy_ns"),
    VAR("MGPU_TRACE", trace, V_STRING, 0, 0, 0, 0, NULL,
        "file the trace is written to at shutdown"),
    VAR("MGPU_METRICS", metrics, V_STRING, 0, 0, 0, 0, NULL,
        "file the metrics are written to at shutdown"),
    VAR("MGPU_TIMEOUT", timeout_ms, V_INT, 1, INT_MAX, 0, DEFAULT_TIMEOUT_MS,
        "milliseconds, 1 to 2147483647", "how long a wait on a peer lasts"),
    /* Checked by mgpu_init, which hands it to util/fault.c. */
    VAR("MGPU_FAULT", fault, V_STRING, 0, 0, 0, 0, NULL,
        "calls made to fail on purpose (docs/faults.md)"),
    VAR("MGPU_CUDA_IPC_LEGACY", cuda_ipc_legacy, V_INT, 0, 1, -1, 0,
        "0 or 1", "share CUDA store objects through legacy cudaIpc handles"),
    VAR("MGPU_OPENCL_BUSY", opencl_busy, V_INT, 0, 1, -1, 1, "0 or 1",
        "OpenCL queues with profiling, for busy_ns and event times"),
    /* Read by the graph layer at each mgpu_graph_instantiate. */
    ENV("MGPU_GRAPH_REPLAY", "devices",
        "how graphs replay: a part per device where the backend can "
        "(devices), runs of nodes joined by events (segments), or node by "
        "node (nodes)"),
    /* The launcher's node-local rank and rank count (MGPU_DEVICES=local). */
    ENV("OMPI_COMM_WORLD_LOCAL_RANK", NULL, "Open MPI's node-local rank"),
    ENV("OMPI_COMM_WORLD_LOCAL_SIZE", NULL, "Open MPI's ranks on the node"),
    ENV("SLURM_LOCALID", NULL, "Slurm's node-local task id"),
    ENV("MPI_LOCALRANKID", NULL, "MPICH's node-local rank"),
    ENV("MPI_LOCALNRANKS", NULL, "MPICH's ranks on the node"),
    ENV("PMI_LOCAL_RANK", NULL, "PMI's node-local rank"),
    ENV("PMI_LOCAL_SIZE", NULL, "PMI's ranks on the node"),
    /* The store: the daemon's (mgpu_store_serve, mgpu_store_default_path)
     * and the client's, read when they are used, not by mgpu_init. */
    ENV("XDG_RUNTIME_DIR", NULL, "the folder of the store's default socket"),
    ENV("MGPU_STORE_CAPACITY", NULL,
        "bytes per device the store daemon may hold (default: the device's "
        "memory)"),
    ENV("MGPU_STORE_TRUST", NULL,
        "users, besides this one and root, whose store daemon is trusted"),
    /* The MPI module (mgpu_mpi_init), through mgpu_module_getenv. */
    ENV("MGPU_MPI_RANKS_PER_NODE", NULL,
        "every k ranks of a machine form a node (default: the machine)"),
    ENV("MGPU_MPI_CUDA_AWARE", "auto",
        "device pointers straight to MPI (1), staged (0), or as MPI says"),
    ENV("MGPU_MPI_STAGE", "0", "1 stages every buffer, host devices too"),
    ENV("MGPU_MPI_TIMEOUT_MS", "30000",
        "how long an MPI call waits for the other ranks (-1: no limit)"),
    ENV("MGPU_MPI_CHUNK", "1M", "bytes per MPI bounce buffer (4K to 1G)"),
};
#define N_VARS (sizeof vars / sizeof vars[0])

/* The row of the variable called name, or NULL. */
static const config_var *find_var(const char *name) {
  for (size_t i = 0; name != NULL && i < N_VARS; i++)
    if (strcmp(vars[i].env, name) == 0) return &vars[i];
  return NULL;
}

/* The environment's value of v, or its text default when unset or empty. */
static const char *var_value(const config_var *v) {
  const char *env = getenv(v->env);
  return env != NULL && *env != '\0' ? env : v->text_def;
}

const char *mgpu__env(const char *name) {
  const config_var *v = find_var(name);
  assert(v != NULL && "an environment variable without its row in vars[]");
  return v != NULL ? var_value(v) : NULL;
}

const char *mgpu_module_getenv(const char *name) {
  const config_var *v = find_var(name);
  if (v == NULL) {
    mgpu__error(MGPU_EINVAL, "environment variable %s is not in libmgpu's "
                "table of variables", name != NULL ? name : "(NULL)");
    return NULL;
  }
  return var_value(v);
}

/* Parses an environment value of an int-valued variable into *out. */
static int parse_int_var(const config_var *v, const char *s, int *out) {
  if (v->kind == V_INT) return parse_int_range(s, (int)v->lo, (int)v->hi, out);
  static const char *const log_names[] = {"none", "warn", "info", "debug"};
  if (v->kind == V_LOG) {
    for (int i = 0; i < 4; i++)
      if (strcasecmp(s, log_names[i]) == 0) return *out = i, 0;
    if (strcmp(s, "0") == 0) return *out = 0, 0;
    return MGPU_EINVAL;
  }
  if (strcasecmp(s, "none") == 0 || strcmp(s, "0") == 0) return *out = 0, 0;
  if (strcasecmp(s, "all") == 0 || strcmp(s, "1") == 0) return *out = 1, 0;
  return MGPU_EINVAL;
}

/* Fills one field from the environment and the default, or checks the
 * caller's value against the bounds. */
static int resolve_var(const config_var *v, mgpu_config *out) {
  char *field = (char *)out + v->offset;
  const char *env = var_value(v);
  if (v->kind == V_STRING) {
    const char **f = (const char **)(void *)field;
    if (*f == NULL) *f = env;
    return 0;
  }
  if (v->kind == V_SIZE) {
    size_t *f = (size_t *)(void *)field;
    if (*f != 0) {
      if (*f < (size_t)v->lo || (v->hi != 0 && *f > (size_t)v->hi))
        return mgpu__error(MGPU_EINVAL, "mgpu_config.%s is %zu (expected %s, "
                           "or 0 to take %s)", v->field, *f, v->expect,
                           v->env);
      return 0;
    }
    if (env != NULL && (mgpu__parse_size(env, f) != 0 ||
                        *f < (size_t)v->lo ||
                        (v->hi != 0 && *f > (size_t)v->hi)))
      return mgpu__error(MGPU_EINVAL, "%s: bad value '%s' (expected %s)",
                         v->env, env, v->expect);
    if (*f == 0) *f = (size_t)v->def;
    return 0;
  }
  int *f = (int *)(void *)field;
  if (*f > v->unset) {
    if (*f < v->lo || *f > v->hi)
      return mgpu__error(MGPU_EINVAL, "mgpu_config.%s is %d (expected %s, "
                         "or %lld to take %s)", v->field, *f, v->expect,
                         v->unset, v->env);
    return 0;
  }
  *f = (int)v->def;
  if (env != NULL && parse_int_var(v, env, f) != 0)
    return mgpu__error(MGPU_EINVAL, "%s: bad value '%s' (expected %s)",
                       v->env, env, v->expect);
  return 0;
}

/* vars[] names every field of mgpu_config but `reserved` (the padding that
 * ended the struct before opencl_busy, never read); opencl_busy is the
 * last. A field added after it must not sit in the padding that ends the
 * struct now (4 bytes where pointers are 8): callers built against this
 * header pass that padding as part of their size, so a size that ends
 * there must still end before the new field, as `reserved` does for
 * opencl_busy. */
_Static_assert((offsetof(mgpu_config, opencl_busy) + sizeof(int) +
                _Alignof(mgpu_config) - 1) / _Alignof(mgpu_config) *
                       _Alignof(mgpu_config) ==
                   sizeof(mgpu_config),
               "a field added to mgpu_config needs its row in vars[]");

static size_t var_size(const config_var *v) {
  switch (v->kind) {
    case V_STRING: return sizeof(const char *);
    case V_SIZE: return sizeof(size_t);
    default: return sizeof(int);
  }
}

/* How many bytes of a caller's mgpu_config of `size` bytes hold whole
 * fields, or 0 when size cuts a field. A caller built against an older
 * header passes the size of its shorter struct: it ends at one of our
 * fields, or after it at the struct's alignment where only padding lies
 * between (its fields beyond take their defaults). A size that cuts a field
 * (or is larger than ours: a newer header, fields we cannot know) would be
 * read past. */
static size_t config_fields_end(size_t size) {
  const size_t align = _Alignof(mgpu_config);
  if (size == sizeof(mgpu_config)) return size;
  for (size_t i = 0; i <= N_VARS; i++) {
    /* i == 0 is the size field itself; then each variable's field. */
    if (i > 0 && vars[i - 1].field == NULL) continue;
    size_t end = i == 0 ? sizeof(size_t)
                        : vars[i - 1].offset + var_size(&vars[i - 1]);
    if (size == end) return end;
    if (size != (end + align - 1) / align * align) continue;
    int padding = 1; /* no field starts in [end, size) */
    for (size_t k = 0; k < N_VARS; k++)
      if (vars[k].field != NULL && vars[k].offset >= end &&
          vars[k].offset < size)
        padding = 0;
    if (padding) return end;
  }
  return 0;
}

int mgpu__config_resolve(const mgpu_config *in, mgpu_config *out) {
  mgpu_config init = MGPU_CONFIG_INITIALIZER;
  *out = init;
  if (in != NULL) {
    size_t end = in->size <= sizeof *out ? config_fields_end(in->size) : 0;
    if (end == 0)
      return mgpu__error(MGPU_EINVAL,
                         "mgpu_config.size is %zu, which %s; set it to "
                         "sizeof(mgpu_config) (%zu)", in->size,
                         in->size > sizeof *out
                             ? "is larger than this library's mgpu_config "
                               "(a newer header)"
                             : "does not end at a field",
                         sizeof *out);
    memcpy(out, in, end);
    out->size = sizeof *out;
  }
  for (size_t i = 0; i < N_VARS; i++) {
    if (vars[i].field == NULL) continue;
    int rc = resolve_var(&vars[i], out);
    if (rc != 0) return rc;
  }
  return 0;
}

/* MGPU_TIMEOUT as resolved by mgpu_init (its default before the first). */
static int config_timeout(void) {
  int t = mgpu__config()->timeout_ms;
  return t > 0 ? t : DEFAULT_TIMEOUT_MS;
}

uint64_t mgpu__deadline(int timeout_ms) {
  if (timeout_ms == 0) timeout_ms = config_timeout();
  if (timeout_ms < 0) return 0;
  return mgpu__now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

int mgpu__timeout_ms(int timeout_ms) {
  return timeout_ms == 0 ? config_timeout() : timeout_ms;
}

int mgpu_timeout_ms(void) { return config_timeout(); }
