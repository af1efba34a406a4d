/* mgpu store: the daemon and its objects from the command line.
 *
 *   mgpu store serve [--socket PATH] [--capacity SIZE] [--allow-group GROUP]
 *   mgpu store [--socket PATH] ls [--json]
 *   mgpu store [--socket PATH] put FILE [--name N] [--device D] [--json]
 *   mgpu store [--socket PATH] get ID|NAME FILE
 *   mgpu store [--socket PATH] rm ID|NAME [--json]
 *   mgpu store [--socket PATH] stat [--json]
 *
 * A key made of digits only is an id, anything else a name. put creates the
 * object, fills it through a host mirror and seals it; get copies a sealed
 * object into FILE through a host mirror. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "mgpu/store.h"
#include "store-serve.h"

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') putchar('\\');
    if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
    else putchar(*s);
  }
  putchar('"');
}

static int usage(void) {
  fprintf(stderr,
          "usage: mgpu store serve [--socket PATH] [--capacity SIZE] "
          "[--allow-group GROUP]\n"
          "       mgpu store [--socket PATH] ls [--json]\n"
          "       mgpu store [--socket PATH] put FILE [--name N] [--device D] "
          "[--json]\n"
          "       mgpu store [--socket PATH] get ID|NAME FILE\n"
          "       mgpu store [--socket PATH] rm ID|NAME [--json]\n"
          "       mgpu store [--socket PATH] stat [--json]\n");
  return 2;
}

static int is_id(const char *key, uint64_t *id) {
  if (key[0] == '\0' || strspn(key, "0123456789") != strlen(key)) return 0;
  *id = strtoull(key, NULL, 10);
  return *id != 0;
}

static int cmd_ls(mgpu_store *st, int json) {
  mgpu_store_entry *e;
  size_t n;
  int rc = mgpu_store_list(st, &e, &n);
  if (rc != 0) return mgpu_cmd_fail("list", rc);
  if (json) printf("[");
  else
    printf("%-8s %-24s %-22s %12s %-6s %-7s %s\n", "id", "name", "device",
           "bytes", "sealed", "deleted", "refs");
  for (size_t i = 0; i < n; i++) {
    if (json) {
      printf("%s\n {\"id\": %llu, \"name\": ", i ? "," : "",
             (unsigned long long)e[i].id);
      json_str(e[i].name);
      printf(", \"device\": ");
      json_str(e[i].device_uuid);
      printf(", \"bytes\": %llu, \"sealed\": %s, \"deleted\": %s, "
             "\"refs\": %u}", (unsigned long long)e[i].bytes,
             e[i].sealed ? "true" : "false", e[i].deleted ? "true" : "false",
             e[i].refs);
    } else {
      printf("%-8llu %-24s %-22s %12llu %-6s %-7s %u\n",
             (unsigned long long)e[i].id, e[i].name[0] ? e[i].name : "-",
             e[i].device_uuid, (unsigned long long)e[i].bytes,
             e[i].sealed ? "yes" : "no", e[i].deleted ? "yes" : "no",
             e[i].refs);
    }
  }
  if (json) printf("%s]\n", n ? "\n" : "");
  mgpu_store_list_free(e);
  return 0;
}

/* The name of a store device's backend kind. */
static const char *backend_name(int kind) {
  return kind == MGPU_BACKEND_CUDA     ? "cuda"
         : kind == MGPU_BACKEND_OPENCL ? "opencl"
                                       : "host";
}

static int cmd_stat(mgpu_store *st, int json) {
  mgpu_store_stats s = {.size = sizeof s};
  int rc = mgpu_store_stats_get(st, &s);
  if (rc != 0) return mgpu_cmd_fail("stats", rc);
  if (json) {
    printf("{\"clients\": %u, \"objects\": %llu, \"refs\": %llu, "
           "\"evictions\": %llu, \"devices\": [", s.clients,
           (unsigned long long)s.objects, (unsigned long long)s.refs,
           (unsigned long long)s.evictions);
    for (int i = 0; i < s.ndevices; i++) {
      printf("%s\n {\"uuid\": ", i ? "," : "");
      json_str(s.devices[i].uuid);
      printf(", \"backend\": \"%s\", \"capacity\": %llu, \"in_use\": %llu, "
             "\"held\": %llu, \"objects\": %llu}",
             backend_name(s.devices[i].backend_kind),
             (unsigned long long)s.devices[i].capacity,
             (unsigned long long)s.devices[i].in_use,
             (unsigned long long)s.devices[i].held,
             (unsigned long long)s.devices[i].objects);
    }
    printf("\n]}\n");
    return 0;
  }
  printf("clients %u, objects %llu, references %llu, evictions %llu\n",
         s.clients, (unsigned long long)s.objects, (unsigned long long)s.refs,
         (unsigned long long)s.evictions);
  printf("%-22s %-7s %14s %14s %14s %8s\n", "device", "backend", "capacity",
         "in use", "held", "objects");
  for (int i = 0; i < s.ndevices; i++)
    printf("%-22s %-7s %14llu %14llu %14llu %8llu\n", s.devices[i].uuid,
           backend_name(s.devices[i].backend_kind),
           (unsigned long long)s.devices[i].capacity,
           (unsigned long long)s.devices[i].in_use,
           (unsigned long long)s.devices[i].held,
           (unsigned long long)s.devices[i].objects);
  return 0;
}

static int cmd_put(mgpu_store *st, const char *file, const char *name,
                   int dev, int json) {
  if (name != NULL && name[0] != '\0' &&
      strspn(name, "0123456789") == strlen(name)) {
    /* get and rm would read it as an id: the object could not be named. */
    fprintf(stderr, "mgpu store put: name '%s' is digits only, which get "
            "and rm read as an object id: give a name with another "
            "character\n", name);
    return 2;
  }
  FILE *f = fopen(file, "rb");
  if (f == NULL) {
    fprintf(stderr, "mgpu store put: %s: %s\n", file, strerror(errno));
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  mgpu_store_object *o = NULL;
  void *host;
  int rc = size > 0 ? mgpu_store_create(st, dev, (size_t)size, name, &o)
                    : MGPU_EINVAL;
  if (size <= 0) fprintf(stderr, "mgpu store put: %s is empty\n", file);
  if (rc == 0) rc = mgpu_store_mirror_begin(o, 0, &host);
  if (rc == 0) {
    if (fread(host, 1, (size_t)size, f) != (size_t)size) {
      fprintf(stderr, "mgpu store put: cannot read %s\n", file);
      rc = MGPU_EIO;
    }
    int end = mgpu_store_mirror_end(o);
    if (rc == 0) rc = end;
  }
  if (rc == 0) rc = mgpu_store_seal(o);
  fclose(f);
  uint64_t id = o ? mgpu_store_object_id(o) : 0;
  if (rc != 0) {
    int r = mgpu_cmd_fail("put", rc);
    if (o != NULL) mgpu_store_release(o); /* unsealed: aborted on exit */
    return r;
  }
  mgpu_store_release(o);
  if (json) {
    printf("{\"id\": %llu, \"name\": ", (unsigned long long)id);
    json_str(name ? name : "");
    printf(", \"bytes\": %ld, \"device\": %d}\n", size, dev);
  } else {
    printf("%llu\n", (unsigned long long)id);
  }
  return 0;
}

static int cmd_get(mgpu_store *st, const char *key, const char *file) {
  mgpu_store_object *o;
  uint64_t id;
  int rc = is_id(key, &id) ? mgpu_store_get(st, id, &o)
                           : mgpu_store_get_by_name(st, key, &o);
  if (rc != 0) return mgpu_cmd_fail("get", rc);
  void *host;
  rc = mgpu_store_mirror_begin(o, 1, &host);
  if (rc == 0) {
    FILE *f = fopen(file, "wb");
    size_t size = mgpu_store_object_size(o);
    if (f == NULL || fwrite(host, 1, size, f) != size) {
      fprintf(stderr, "mgpu store get: %s: %s\n", file, strerror(errno));
      rc = MGPU_EIO;
    }
    if (f != NULL && fclose(f) != 0) rc = MGPU_EIO;
    mgpu_store_mirror_end(o);
    if (rc != 0) {
      mgpu_store_release(o);
      return 1;
    }
  }
  if (rc != 0) {
    int r = mgpu_cmd_fail("mirror", rc);
    mgpu_store_release(o);
    return r;
  }
  return mgpu_store_release(o) == 0 ? 0 : mgpu_cmd_fail("release", rc);
}

static int cmd_rm(mgpu_store *st, const char *key, int json) {
  uint64_t id;
  int deferred = 0;
  int rc = is_id(key, &id) ? mgpu_store_delete(st, id, &deferred)
                           : mgpu_store_delete_by_name(st, key, &deferred);
  if (rc != 0) return mgpu_cmd_fail("rm", rc);
  if (json)
    printf("{\"key\": \"%s\", \"deferred\": %s}\n", key,
           deferred ? "true" : "false");
  else if (deferred)
    printf("%s: deleted; freed once its last reference is released\n", key);
  return 0;
}

int mgpu_cmd_store(int argc, char **argv) {
  int i = 1;
  const char *path = NULL;
  if (i < argc && strcmp(argv[i], "serve") == 0)
    return mgpu_store_serve_main(argc - i, argv + i);
  if (i + 1 < argc && strcmp(argv[i], "--socket") == 0) {
    path = argv[i + 1];
    i += 2;
  }
  if (i >= argc) return usage();
  const char *sub = argv[i++];
  int json = 0, dev = 0;
  const char *name = NULL, *pos[2] = {NULL, NULL};
  int npos = 0;
  for (; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) json = 1;
    else if (strcmp(argv[i], "--name") == 0 && i + 1 < argc) name = argv[++i];
    else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      const char *d = argv[++i];
      char *end;
      errno = 0;
      long v = strtol(d, &end, 10);
      if (end == d || *end != '\0' || errno != 0 || v < 0 || v > 1 << 20) {
        fprintf(stderr, "mgpu store: --device %s is not a device number "
                "(0, 1, ...)\n", d);
        return 2;
      }
      dev = (int)v;
    }
    else if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc)
      path = argv[++i];
    else if (argv[i][0] != '-' && npos < 2) pos[npos++] = argv[i];
    else return usage();
  }
  int need = strcmp(sub, "put") == 0 || strcmp(sub, "rm") == 0 ? 1
             : strcmp(sub, "get") == 0                         ? 2
                                                               : 0;
  if (npos != need) return usage();
  if (strcmp(sub, "ls") && strcmp(sub, "stat") && strcmp(sub, "put") &&
      strcmp(sub, "get") && strcmp(sub, "rm"))
    return usage();
  /* put and get map objects onto this process's devices. */
  if (strcmp(sub, "put") == 0 || strcmp(sub, "get") == 0) {
    int rc = mgpu_cmd_init();
    if (rc != 0) return rc;
  }
  mgpu_store *st;
  int rc = mgpu_store_connect(&st, path);
  if (rc != 0) return mgpu_cmd_fail("connect", rc);
  if (strcmp(sub, "ls") == 0) rc = cmd_ls(st, json);
  else if (strcmp(sub, "stat") == 0) rc = cmd_stat(st, json);
  else if (strcmp(sub, "put") == 0) rc = cmd_put(st, pos[0], name, dev, json);
  else if (strcmp(sub, "get") == 0) rc = cmd_get(st, pos[0], pos[1]);
  else rc = cmd_rm(st, pos[0], json);
  mgpu_store_disconnect(st);
  return rc;
}
