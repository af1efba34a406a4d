/* Configuration: the mgpu_config given to mgpu_init, completed from the
 * environment and then from the defaults. Environment variables are read
 * here, once, and nowhere else. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/internal.h"
#include "mgpu/topo.h" /* the staging bounds */

#define DEFAULT_HOST_MEM ((size_t)1 << 30)
#define DEFAULT_HOST_WORKERS 2
#define DEFAULT_STAGING_DEPTH 3

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

static int parse_log_level(const char *s, int *out) {
  static const char *names[] = {"none", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(s, names[i]) == 0) {
      *out = i;
      return 0;
    }
  }
  if (strcmp(s, "0") == 0 || strcmp(s, "") == 0) {
    *out = 0;
    return 0;
  }
  return mgpu__error(MGPU_EINVAL,
                     "MGPU_LOG: bad value '%s' (expected none, warn, info or "
                     "debug)", s);
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

/* One token of MGPU_DEVICES: host[:N] | cuda[:K[/S]]. */
static int parse_device_token(const char *tok, mgpu__devspec_entry *e) {
  memset(e, 0, sizeof *e);
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
  if (name_len == 4 && strncmp(tok, "cuda", 4) == 0) {
    e->backend = MGPU_BACKEND_CUDA;
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
    if (parse_device_token(tok, &out[*n]) != 0)
      return mgpu__error(MGPU_EINVAL,
                         "MGPU_DEVICES='%s': bad token '%s' (expected host:N, "
                         "cuda, cuda:K or cuda:K/S)", spec, tok);
    (*n)++;
    if (comma == NULL) return 0;
    p = comma + 1;
  }
}

int mgpu__config_resolve(const mgpu_config *in, mgpu_config *out) {
  mgpu_config init = MGPU_CONFIG_INITIALIZER;
  *out = init;
  if (in != NULL) {
    if (in->size < sizeof(size_t) || in->size > sizeof *out)
      return mgpu__error(MGPU_EINVAL,
                         "mgpu_config.size is %zu; set it to sizeof(mgpu_config)"
                         " (%zu)", in->size, sizeof *out);
    memcpy(out, in, in->size);
    out->size = sizeof *out;
  }
  const char *env;
  if (out->devices == NULL && (env = getenv("MGPU_DEVICES")) && *env)
    out->devices = env;
  if (out->host_mem == 0 && (env = getenv("MGPU_HOST_MEM")) && *env) {
    if (mgpu__parse_size(env, &out->host_mem) != 0 || out->host_mem == 0)
      return mgpu__error(MGPU_EINVAL,
                         "MGPU_HOST_MEM: bad size '%s' (expected e.g. 512M, 2G)",
                         env);
  }
  if (out->host_mem == 0) out->host_mem = DEFAULT_HOST_MEM;
  if (out->log_level < 0) {
    out->log_level = MGPU_LOG_NONE;
    if ((env = getenv("MGPU_LOG")) && parse_log_level(env, &out->log_level))
      return MGPU_EINVAL;
  }
  if (out->log_level > MGPU_LOG_DEBUG) out->log_level = MGPU_LOG_DEBUG;
  if (out->host_workers <= 0 && (env = getenv("MGPU_HOST_WORKERS")) && *env) {
    if (parse_int_range(env, 1, 64, &out->host_workers))
      return mgpu__error(MGPU_EINVAL, "MGPU_HOST_WORKERS: bad value '%s' "
                         "(expected 1 to 64)", env);
  }
  if (out->host_workers <= 0) out->host_workers = DEFAULT_HOST_WORKERS;
  if (out->host_peer < 0 && (env = getenv("MGPU_HOST_PEER")) && *env) {
    if (strcasecmp(env, "none") == 0 || strcmp(env, "0") == 0)
      out->host_peer = 0;
    else if (strcasecmp(env, "all") == 0 || strcmp(env, "1") == 0)
      out->host_peer = 1;
    else
      return mgpu__error(MGPU_EINVAL, "MGPU_HOST_PEER: bad value '%s' "
                         "(expected none or all)", env);
  }
  if (out->host_peer < 0) out->host_peer = 1;
  if (out->staging_chunk == 0 && (env = getenv("MGPU_STAGING_CHUNK")) && *env) {
    if (mgpu__parse_size(env, &out->staging_chunk) ||
        out->staging_chunk < MGPU_STAGING_CHUNK_MIN ||
        out->staging_chunk > MGPU_STAGING_CHUNK_MAX)
      return mgpu__error(MGPU_EINVAL, "MGPU_STAGING_CHUNK: bad size '%s' "
                         "(expected 4K to 64M)", env);
  }
  /* staging_chunk left 0: the copy layer picks it per pair of devices. */
  if (out->staging_depth <= 0 && (env = getenv("MGPU_STAGING_DEPTH")) && *env) {
    if (parse_int_range(env, 2, MGPU_STAGING_DEPTH_MAX, &out->staging_depth))
      return mgpu__error(MGPU_EINVAL, "MGPU_STAGING_DEPTH: bad value '%s' "
                         "(expected 2 to 64)", env);
  }
  if (out->staging_depth <= 0) out->staging_depth = DEFAULT_STAGING_DEPTH;
  if (out->plugin_path == NULL && (env = getenv("MGPU_PLUGIN_PATH")) && *env)
    out->plugin_path = env;
  if (out->cuda_green < 0 && (env = getenv("MGPU_CUDA_GREEN")) && *env) {
    if (parse_int_range(env, 0, 1, &out->cuda_green))
      return mgpu__error(MGPU_EINVAL, "MGPU_CUDA_GREEN: bad value '%s' "
                         "(expected 0 or 1)", env);
  }
  if (out->cuda_green < 0) out->cuda_green = 1;
  if (out->cuda_busy < 0 && (env = getenv("MGPU_CUDA_BUSY")) && *env) {
    if (parse_int_range(env, 0, 1, &out->cuda_busy))
      return mgpu__error(MGPU_EINVAL, "MGPU_CUDA_BUSY: bad value '%s' "
                         "(expected 0 or 1)", env);
  }
  if (out->cuda_busy < 0) out->cuda_busy = 1;
  if (out->staging_depth < 2)
    return mgpu__error(MGPU_EINVAL, "staging_depth %d: at least 2 bounce "
                       "buffers are needed", out->staging_depth);
  return 0;
}
