/* The store: a daemon process, client processes, the bytes they share, and
 * what happens when any of them misbehaves or dies. Every test starts its
 * own daemon (a child process, instrumented like the test) on a socket in a
 * fresh private directory, and stops it at the end: the daemon must exit
 * cleanly, which under ASan also means without leaks. */
#include <dirent.h>
#include <grp.h>
#include <pthread.h>
#include <pwd.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "backend/import-map.h"
#include "store-helpers.h"
#include "store/proto.h"
#include "util/fault.h"

#define MIB (1024u * 1024u)

/* The byte at offset i of pattern seed. */
static uint8_t pat(unsigned seed, size_t i) {
  return (uint8_t)(i * 131u + seed * 7u + (i >> 12));
}

static void fill_pattern(uint8_t *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = pat(seed, i);
}

static int check_pattern(const uint8_t *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != pat(seed, i)) {
      fprintf(stderr, "byte %zu is %u, expected %u\n", i, p[i], pat(seed, i));
      return 0;
    }
  return 1;
}


/* Objects are written and read through their buffers, so the same tests run
 * on CUDA devices, where the mapping is device memory. */
static void obj_fill(mgpu_store_object *o, unsigned seed) {
  size_t n = mgpu_store_object_size(o);
  uint8_t *h = malloc(n);
  ASSERT(h != NULL);
  fill_pattern(h, n, seed);
  ASSERT_OK(mgpu_memcpy_htod(mgpu_store_object_buffer(o), 0, h, n));
  free(h);
}

static int obj_check(mgpu_store_object *o, unsigned seed) {
  size_t n = mgpu_store_object_size(o);
  uint8_t *h = malloc(n);
  ASSERT(h != NULL);
  ASSERT_OK(mgpu_memcpy_dtoh(h, mgpu_store_object_buffer(o), 0, n));
  int ok = check_pattern(h, n, seed);
  free(h);
  return ok;
}

/* Device k of the open ones, wrapped: the tests name devices 0 to 3, and
 * run on whatever devices are open (one CUDA device, host:4). */
static int store_dev(int k) {
  int n = mgpu_device_count();
  ASSERT(n > 0);
  return k % n;
}

/* Whether the store takes devices a and b for one (the parts of a split
 * GPU, cuda:0/4, share its UUID): they share a capacity, and an object got
 * back lands on the first of them. A device without a UUID (OpenCL) is
 * named by its ordinal too (src/store/mem.c), so it is never another's. */
static int same_gpu(int a, int b) {
  mgpu_device_props pa = {.size = sizeof pa}, pb = {.size = sizeof pb};
  ASSERT_OK(mgpu_device_get_props(a, &pa));
  ASSERT_OK(mgpu_device_get_props(b, &pb));
  return a != b && pa.uuid[0] != '\0' && strcmp(pa.uuid, pb.uuid) == 0;
}

/* The device an object of device k's GPU is got on: the first of them. */
static int got_dev(int k) {
  for (int d = 0; d < k; d++)
    if (same_gpu(d, k)) return d;
  return k;
}

static int on_host_device(mgpu_store_object *o) {
  mgpu_device_props p = {.size = sizeof p};
  ASSERT_OK(mgpu_device_get_props(mgpu_store_object_device(o), &p));
  return p.backend_kind == MGPU_BACKEND_HOST;
}

/* ---- the protocol ---- */

static size_t encode_sample(mgpu__store_wbuf *w, int which) {
  mgpu__store_objdesc d = {.id = 7, .size = 100, .map_size = 4096,
                           .offset = 0, .instance = 99,
                           .handle_kind = MGPU__SH_MEMFD, .sealed = 1};
  snprintf(d.uuid, sizeof d.uuid, "host-0011aabb-1");
  snprintf(d.name, sizeof d.name, "weights");
  switch (which) {
    case 0:
      mgpu__store_wbuf_begin(w, MGPU__SM_CREATE, 5);
      mgpu__store_put_str(w, "host-0011aabb-1", 39);
      mgpu__store_put_u64(w, 100);
      mgpu__store_put_str(w, "weights", 255);
      break;
    case 1:
      mgpu__store_wbuf_begin(w, MGPU__SM_GET | MGPU__SM_REPLY, 6);
      mgpu__store_put_objdesc(w, &d);
      break;
    case 2:
      mgpu__store_wbuf_begin(w, MGPU__SM_LIST | MGPU__SM_REPLY, 7);
      mgpu__store_put_u32(w, 2);
      mgpu__store_put_u8(w, 0);
      for (int i = 0; i < 2; i++) {
        mgpu__store_put_u64(w, (uint64_t)i + 1);
        mgpu__store_put_u64(w, 4096);
        mgpu__store_put_u32(w, 3);
        mgpu__store_put_u8(w, 1);
        mgpu__store_put_u8(w, 0);
        mgpu__store_put_str(w, "host-0011aabb-0", 39);
        mgpu__store_put_str(w, i ? "b" : "", 255);
      }
      break;
    default:
      mgpu__store_wbuf_begin(w, MGPU__SM_ERROR, 8);
      mgpu__store_put_u32(w, (uint32_t)MGPU_ENOENT);
      mgpu__store_put_str(w, "no object 5", 511);
      break;
  }
  ASSERT_OK(mgpu__store_wbuf_end(w));
  return w->len;
}

/* The start of most tests here: a fresh folder, a daemon on the devices'
 * memory, mgpu initialized. */
static void store_up(store_env *env) {
  store_env_init(env);
  store_daemon_start(env, 0);
  test_init();
}

/* Their end: the daemon stops cleanly, the folder goes. */
static void store_down(store_env *env) {
  store_daemon_stop(env);
  store_env_cleanup(env);
}

/* The import map both backends keep their imports in: one mapping per
 * key, found by any address inside it, gone with its last reference. */
TEST_IMPL(import_map_counts_references) {
  mgpu__import_map map = MGPU__IMPORT_MAP_INITIALIZER;
  const uint64_t k1[2] = {7, 1}, k2[2] = {7, 2};
  mgpu__import_entry a = {.base = 0x10000, .map_size = 0x1000};
  mgpu__import_entry b = {.base = 0x20000, .map_size = 0x2000};
  ASSERT_EQ(mgpu__import_ref(&map, k1), 0); /* not mapped yet */
  mgpu__import_add(&map, &a, k1);
  mgpu__import_add(&map, &b, k2);
  ASSERT_EQ(mgpu__import_ref(&map, k1), 0x10000); /* a second reference */
  ASSERT_EQ(a.refs, 2);
  mgpu__import_lock(&map);
  ASSERT(mgpu__import_find_locked(&map, 0x21fff) == &b);
  ASSERT(mgpu__import_find_locked(&map, 0x22000) == NULL);
  ASSERT(mgpu__import_find_locked(&map, 0x10000) == &a);
  mgpu__import_unlock(&map);
  ASSERT(mgpu__import_unref(&map, 0x30000) == NULL); /* not imported */
  ASSERT(mgpu__import_unref(&map, 0x10800) == NULL); /* one left */
  ASSERT(mgpu__import_unref(&map, 0x10001) == &a);   /* the last: gone */
  ASSERT_EQ(mgpu__import_ref(&map, k1), 0);
  ASSERT_EQ(mgpu__import_ref(&map, k2), 0x20000);
  ASSERT(mgpu__import_unref(&map, 0x20000) == NULL);
  ASSERT(mgpu__import_unref(&map, 0x20000) == &b);
  ASSERT(map.head == NULL);
  return 0;
}

TEST_IMPL(proto_roundtrip) {
  for (int which = 0; which < 4; which++) {
    mgpu__store_wbuf w = {0};
    size_t len = encode_sample(&w, which);
    mgpu__store_msg m;
    char why[256];
    ASSERT_OK(mgpu__store_decode(w.data, len, &m, why, sizeof why));
    switch (which) {
      case 0:
        ASSERT_EQ(m.type, MGPU__SM_CREATE);
        ASSERT_EQ(m.seq, 5);
        ASSERT_EQ(m.size, 100);
        ASSERT(strcmp(m.uuid, "host-0011aabb-1") == 0);
        ASSERT(strcmp(m.name, "weights") == 0);
        break;
      case 1:
        ASSERT_EQ(m.obj.id, 7);
        ASSERT_EQ(m.obj.map_size, 4096);
        ASSERT_EQ(m.obj.instance, 99);
        ASSERT(strcmp(m.obj.name, "weights") == 0);
        break;
      case 2:
        ASSERT_EQ(m.count, 2);
        ASSERT_EQ(m.entries[1].id, 2);
        ASSERT_EQ(m.entries[1].refs, 3);
        ASSERT(strcmp(m.entries[1].name, "b") == 0);
        break;
      default:
        ASSERT_EQ(m.code, MGPU_ENOENT);
        ASSERT(strcmp(m.detail, "no object 5") == 0);
    }
    mgpu__store_msg_free(&m);
    /* Every truncation is refused, with a reason, and reads nothing past
     * the end (ASan watches the copy). */
    for (size_t cut = 0; cut < len; cut++) {
      uint8_t *copy = malloc(cut ? cut : 1);
      memcpy(copy, w.data, cut);
      why[0] = '\0';
      ASSERT_EQ(mgpu__store_decode(copy, cut, &m, why, sizeof why),
                MGPU_EINVAL);
      ASSERT(why[0] != '\0');
      mgpu__store_msg_free(&m);
      free(copy);
    }
    /* A payload one byte longer than its fields is refused too. */
    uint8_t *longer = calloc(1, len + 1);
    memcpy(longer, w.data, len);
    longer[12]++;
    ASSERT_EQ(mgpu__store_decode(longer, len + 1, &m, why, sizeof why),
              MGPU_EINVAL);
    ASSERT(strstr(why, "left over") != NULL);
    mgpu__store_msg_free(&m);
    free(longer);
    mgpu__store_wbuf_free(&w);
  }
  return 0;
}

TEST_IMPL(proto_rejects) {
  mgpu__store_wbuf w = {0};
  mgpu__store_msg m;
  char why[256];
  /* Unknown version. */
  size_t len = encode_sample(&w, 0);
  w.data[4] = 9;
  ASSERT_EQ(mgpu__store_decode(w.data, len, &m, why, sizeof why), MGPU_EINVAL);
  ASSERT(strstr(why, "version 9") != NULL);
  mgpu__store_msg_free(&m);
  mgpu__store_wbuf_free(&w);
  /* A name with a control character. */
  mgpu__store_wbuf_begin(&w, MGPU__SM_GET, 1);
  mgpu__store_put_u64(&w, 0);
  mgpu__store_put_str(&w, "bad\nname", 255);
  ASSERT_OK(mgpu__store_wbuf_end(&w));
  ASSERT_EQ(mgpu__store_decode(w.data, w.len, &m, why, sizeof why),
            MGPU_EINVAL);
  mgpu__store_msg_free(&m);
  mgpu__store_wbuf_free(&w);
  /* Both keys at once. */
  mgpu__store_wbuf_begin(&w, MGPU__SM_DELETE, 1);
  mgpu__store_put_u64(&w, 3);
  mgpu__store_put_str(&w, "x", 255);
  ASSERT_OK(mgpu__store_wbuf_end(&w));
  ASSERT_EQ(mgpu__store_decode(w.data, w.len, &m, why, sizeof why),
            MGPU_EINVAL);
  ASSERT(strstr(why, "exactly one") != NULL);
  mgpu__store_msg_free(&m);
  mgpu__store_wbuf_free(&w);
  /* A list count far beyond the bytes allocates nothing and fails. */
  mgpu__store_wbuf_begin(&w, MGPU__SM_LIST | MGPU__SM_REPLY, 1);
  mgpu__store_put_u32(&w, 0xffffffffu);
  mgpu__store_put_u8(&w, 0);
  ASSERT_OK(mgpu__store_wbuf_end(&w));
  ASSERT_EQ(mgpu__store_decode(w.data, w.len, &m, why, sizeof why),
            MGPU_EINVAL);
  ASSERT(m.entries == NULL);
  mgpu__store_msg_free(&m);
  mgpu__store_wbuf_free(&w);
  /* A header announcing more than the maximum. */
  uint8_t hdr[16] = {'M', 'G', 'S', 'T', 1, 0, 1, 0, 0, 0, 0, 0,
                     0xff, 0xff, 0xff, 0x7f};
  uint32_t plen;
  ASSERT_EQ(mgpu__store_header_check(hdr, &plen, why, sizeof why),
            MGPU_EINVAL);
  ASSERT(strstr(why, "maximum") != NULL);
  /* Random bytes never crash the decoder. */
  uint64_t seed = 12345;
  uint8_t buf[300];
  for (int i = 0; i < 20000; i++) {
    size_t n = test_rand(&seed) % sizeof buf;
    for (size_t k = 0; k < n; k++) buf[k] = (uint8_t)test_rand(&seed);
    if (n >= 16) {
      memcpy(buf, "MGST\1\0", 6);
      buf[6] = (uint8_t)(test_rand(&seed) % 9);
      buf[7] = (test_rand(&seed) & 1) ? 0x80 : 0;
      uint32_t pl = (uint32_t)(n - 16);
      memcpy(buf + 12, &pl, 4);
    }
    mgpu__store_decode(buf, n, &m, why, sizeof why);
    mgpu__store_msg_free(&m);
  }
  return 0;
}

/* ---- two processes share bytes ---- */

typedef struct share_args {
  int to_parent, from_parent; /* pipe ends */
  size_t size;
  unsigned seed;
  int dev;
  const char *name;
} share_args;

static int creator_main(store_env *env, void *arg) {
  share_args *a = arg;
  ASSERT_OK(mgpu_init(NULL));
  mgpu_store *st;
  mgpu_store_object *obj;
  ASSERT_OK(mgpu_store_connect(&st, env->path));
  ASSERT_OK(mgpu_store_create(st, store_dev(a->dev), a->size, a->name, &obj));
  ASSERT_EQ(mgpu_store_object_size(obj), a->size);
  ASSERT_EQ(mgpu_store_object_device(obj), store_dev(a->dev));
  obj_fill(obj, a->seed);
  ASSERT_OK(mgpu_store_seal(obj));
  ASSERT_OK(mgpu_store_release(obj));
  ASSERT_OK(mgpu_store_disconnect(st));
  return 0;
}

static int reader_main(store_env *env, void *arg) {
  share_args *a = arg;
  ASSERT_OK(mgpu_init(NULL));
  mgpu_store *st;
  mgpu_store_object *obj;
  ASSERT_OK(mgpu_store_connect(&st, env->path));
  ASSERT_OK(mgpu_store_get_by_name(st, a->name, &obj));
  ASSERT_EQ(mgpu_store_object_size(obj), a->size);
  ASSERT_EQ(mgpu_store_object_device(obj), got_dev(store_dev(a->dev)));
  ASSERT(obj_check(obj, a->seed));
  /* The same object by id maps once and reads the same. */
  mgpu_store_object *again;
  ASSERT_OK(mgpu_store_get(st, mgpu_store_object_id(obj), &again));
  ASSERT(mgpu_store_object_ptr(again) == mgpu_store_object_ptr(obj));
  ASSERT_OK(mgpu_store_release(again));
  ASSERT(obj_check(obj, a->seed));
  ASSERT_ERR(MGPU_EREADONLY, mgpu_memcpy_htod(mgpu_store_object_buffer(obj),
                                              0, "x", 1));
  /* The object's buffer is the object's: mgpu_free refuses it (it returned
   * 0 and left the object with a dead buffer). */
  ASSERT_ERR(MGPU_EINVAL, mgpu_free(mgpu_store_object_buffer(obj)));
  ASSERT_DETAIL_HAS("belongs to a store object");
  ASSERT(obj_check(obj, a->seed));
  /* A write into the mapping is refused by the hardware: try it in a
   * grandchild, which must die of SIGSEGV (host memory only). */
  if (!on_host_device(obj)) goto done;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    /* The default action, not a sanitizer's report, is the proof. */
    signal(SIGSEGV, SIG_DFL);
    ((volatile uint8_t *)mgpu_store_object_ptr(obj))[0] = 1;
    _exit(0);
  }
  int status = store_wait(pid, 10000);
  ASSERT(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
done:
  ASSERT_OK(mgpu_store_release(obj));
  ASSERT_ERR(MGPU_EFREED, mgpu_store_release(obj));
  ASSERT_OK(mgpu_store_disconnect(st));
  return 0;
}

TEST_IMPL(share_two_processes) {
  store_env env;
  store_env_init(&env);
  store_daemon_start(&env, 0);
  share_args a = {.size = 3 * MIB + 123, .seed = 5, .dev = 1, .name = "w"};
  ASSERT_CHILD_OK(store_spawn(creator_main, &env, &a), 60000);
  ASSERT_CHILD_OK(store_spawn(reader_main, &env, &a), 60000);
  /* The sealed object outlives both, unreferenced. */
  store_expect_counts(&env, 1, 0);
  mgpu_store *st;
  ASSERT_OK(mgpu_store_connect(&st, env.path));
  mgpu_store_entry *e;
  size_t n;
  ASSERT_OK(mgpu_store_list(st, &e, &n));
  ASSERT_EQ(n, 1);
  ASSERT(strcmp(e[0].name, "w") == 0);
  ASSERT_EQ(e[0].bytes, a.size);
  ASSERT(e[0].sealed && !e[0].deleted);
  mgpu_store_list_free(e);
  int deferred = -1;
  ASSERT_OK(mgpu_store_delete_by_name(st, "w", &deferred));
  ASSERT_EQ(deferred, 0);
  ASSERT_OK(mgpu_store_disconnect(st));
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

/* ---- lifetimes in one process ---- */

TEST_IMPL(lifetimes) {
  store_env env;
  store_env_init(&env);
  store_daemon_start(&env, 0);
  int ndev = test_init(); /* the daemon opens the same devices */
  mgpu_store *a, *b;
  ASSERT_OK(mgpu_store_connect(&a, env.path));
  ASSERT_OK(mgpu_store_connect(&b, env.path));
  mgpu_store_object *o, *g, *x;
  ASSERT_OK(mgpu_store_create(a, 0, 4096, "obj", &o));
  ASSERT_ERR(MGPU_EEXIST, mgpu_store_create(a, 0, 10, "obj", &x));
  ASSERT_DETAIL_HAS("obj");
  /* Not gettable before the seal; only its creator seals it. */
  ASSERT_ERR(MGPU_EAGAIN, mgpu_store_get_by_name(b, "obj", &g));
  ASSERT_ERR(MGPU_ENOENT, mgpu_store_get_by_name(b, "nothing", &g));
  ASSERT_ERR(MGPU_ENOENT, mgpu_store_get(b, 999, &g));
  ASSERT_DETAIL_HAS("999");
  obj_fill(o, 0x5a);
  ASSERT_OK(mgpu_store_seal(o));
  ASSERT_ERR(MGPU_EALREADY, mgpu_store_seal(o));
  ASSERT_OK(mgpu_store_get_by_name(b, "obj", &g));
  uint64_t id = mgpu_store_object_id(g);
  ASSERT_EQ(id, mgpu_store_object_id(o));
  /* Deleted while b maps it: deferred, no longer gettable, still
   * readable, and its name is free again. */
  int deferred = 0;
  ASSERT_OK(mgpu_store_delete(a, id, &deferred));
  ASSERT_EQ(deferred, 1);
  ASSERT_ERR(MGPU_ENOENT, mgpu_store_get(a, id, &x));
  ASSERT_DETAIL_HAS("deleted");
  ASSERT_ERR(MGPU_ENOENT, mgpu_store_delete(a, id, NULL));
  ASSERT_OK(mgpu_store_release(o));
  ASSERT(obj_check(g, 0x5a));
  mgpu_store_stats s = {.size = sizeof s};
  ASSERT_OK(mgpu_store_stats_get(a, &s));
  ASSERT_EQ(s.objects, 1);
  ASSERT_EQ(s.refs, 1);
  ASSERT_EQ(s.clients, 2);
  ASSERT_EQ(s.ndevices, ndev);
  ASSERT_EQ(s.devices[0].in_use, 4096);
  ASSERT_EQ(s.devices[0].held, 4096);
  ASSERT_EQ(s.devices[0].objects, 1);
  ASSERT_OK(mgpu_store_create(a, 0, 8, "obj", &x)); /* the name is free */
  ASSERT_OK(mgpu_store_release(g));
  /* An unsealed object released by its creator stays until deleted. */
  ASSERT_OK(mgpu_store_release(x));
  ASSERT_OK(mgpu_store_stats_get(a, &s));
  ASSERT_EQ(s.objects, 1);
  ASSERT_EQ(s.devices[0].in_use, 8);
  ASSERT_OK(mgpu_store_delete_by_name(b, "obj", NULL));
  /* Bad handles and arguments. */
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_store_release(NULL));
  ASSERT_ERR(MGPU_EINVAL, mgpu_store_create(a, 0, 0, NULL, &x));
  ASSERT_ERR(MGPU_ENODEV, mgpu_store_create(a, 9, 10, NULL, &x));
  ASSERT_ERR(MGPU_EINVAL, mgpu_store_create(a, 0, 10, "bad\tname", &x));
  ASSERT_EQ(mgpu_store_object_ptr(o), NULL);
  ASSERT_OK(mgpu_store_disconnect(a));
  ASSERT_OK(mgpu_store_disconnect(b));
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_store_disconnect(b));
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

TEST_IMPL(mirror) {
  store_env env;
  store_up(&env);
  mgpu_store *st;
  ASSERT_OK(mgpu_store_connect(&st, env.path));
  mgpu_store_object *o, *g;
  size_t n = 100000;
  ASSERT_OK(mgpu_store_create(st, store_dev(2), n, "m", &o));
  uint8_t *host;
  ASSERT_OK(mgpu_store_mirror_begin(o, 0, (void **)&host));
  void *second;
  ASSERT_ERR(MGPU_EALREADY, mgpu_store_mirror_begin(o, 0, &second));
  fill_pattern(host, n, 3);
  ASSERT_OK(mgpu_store_mirror_end(o)); /* writable: written back */
  ASSERT(obj_check(o, 3));
  ASSERT_OK(mgpu_store_seal(o));
  ASSERT_OK(mgpu_store_get_by_name(st, "m", &g));
  ASSERT_OK(mgpu_store_mirror_begin(g, 1, (void **)&host));
  ASSERT(check_pattern(host, n, 3));
  host[0] ^= 0xff;
  ASSERT_OK(mgpu_store_mirror_end(g)); /* read-only: dropped */
  ASSERT(obj_check(g, 3));
  ASSERT_ERR(MGPU_EINVAL, mgpu_store_mirror_end(g));
  /* A mirror still open is freed with its object. */
  ASSERT_OK(mgpu_store_mirror_begin(g, 1, (void **)&host));
  ASSERT_OK(mgpu_store_release(g));
  ASSERT_OK(mgpu_store_release(o));
  ASSERT_OK(mgpu_store_delete_by_name(st, "m", NULL));
  ASSERT_OK(mgpu_store_disconnect(st));
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

/* Objects on an OpenCL device: the daemon starts on OpenCL devices (named
 * without a UUID), holds their objects in host memory, and clients reach
 * them through the pointer and the host mirror; an mgpu copy takes the
 * bytes onto the device. Skips where the OpenCL plugin or device is
 * missing. */
TEST_IMPL(opencl_objects_in_host_memory) {
  const char *devices = "opencl:0,host:1";
  setenv("POCL_DEVICES", "pthread", 0);
  setenv("MGPU_DEVICES", devices, 1); /* the daemon's too */
  mgpu_config cfg = MGPU_CONFIG_INITIALIZER;
  cfg.devices = devices;
  int rc = mgpu_init(&cfg);
  if (rc == MGPU_EPLUGIN || rc == MGPU_ENODEV) {
    printf("skipped: %s\n", mgpu_error_detail());
    return TEST_SKIP;
  }
  ASSERT_OK(rc);
  store_env env;
  store_env_init(&env);
  store_daemon_start(&env, 0);
  mgpu_store *a, *b;
  ASSERT_OK(mgpu_store_connect(&a, env.path));
  ASSERT_OK(mgpu_store_connect(&b, env.path));
  size_t n = 200000;
  mgpu_store_object *o, *g;
  ASSERT_OK(mgpu_store_create(a, 0, n, "cl", &o));
  /* Host memory: a pointer, and a buffer of pinned memory of the OpenCL
   * device (its kernels take only its own memory; copies take this). */
  ASSERT(mgpu_store_object_ptr(o) != NULL);
  ASSERT(mgpu_store_object_buffer(o) != NULL);
  ASSERT_EQ(mgpu_buffer_kind(mgpu_store_object_buffer(o)), MGPU_MEM_PINNED);
  uint8_t *host;
  ASSERT_OK(mgpu_store_mirror_begin(o, 0, (void **)&host));
  fill_pattern(host, n, 7);
  ASSERT_OK(mgpu_store_mirror_end(o)); /* writable: written back */
  ASSERT(check_pattern(mgpu_store_object_ptr(o), n, 7));
  ASSERT_OK(mgpu_store_seal(o));
  ASSERT_OK(mgpu_store_get_by_name(b, "cl", &g));
  ASSERT(check_pattern(mgpu_store_object_ptr(g), n, 7));
  ASSERT_OK(mgpu_store_mirror_begin(g, 1, (void **)&host));
  ASSERT(check_pattern(host, n, 7));
  ASSERT_OK(mgpu_store_mirror_end(g));
  /* Onto the device and back. */
  mgpu_buffer *dev;
  uint8_t *back = malloc(n);
  ASSERT(back != NULL);
  ASSERT_OK(mgpu_malloc(&dev, 0, n));
  ASSERT_OK(mgpu_memcpy(dev, 0, mgpu_store_object_buffer(g), 0, n));
  ASSERT_OK(mgpu_memcpy_dtoh(back, dev, 0, n));
  ASSERT(check_pattern(back, n, 7));
  ASSERT_ERR(MGPU_EREADONLY,
             mgpu_memcpy(mgpu_store_object_buffer(g), 0, dev, 0, n));
  ASSERT_OK(mgpu_free(dev));
  free(back);
  /* The daemon counts it against the OpenCL device, named alike by both
   * processes. */
  mgpu_store_stats s = {.size = sizeof s};
  ASSERT_OK(mgpu_store_stats_get(a, &s));
  ASSERT_EQ(s.ndevices, 2);
  ASSERT_EQ(s.devices[0].backend_kind, MGPU_BACKEND_OPENCL);
  ASSERT(strncmp(s.devices[0].uuid, "opencl-", 7) == 0);
  ASSERT_EQ(s.devices[0].in_use, n);
  ASSERT_EQ(s.devices[1].in_use, 0);
  mgpu_store_entry *e;
  size_t count;
  ASSERT_OK(mgpu_store_list(a, &e, &count));
  ASSERT_EQ(count, 1);
  ASSERT(strcmp(e[0].device_uuid, s.devices[0].uuid) == 0);
  mgpu_store_list_free(e);
  ASSERT_OK(mgpu_store_release(g));
  ASSERT_OK(mgpu_store_release(o));
  ASSERT_OK(mgpu_store_delete_by_name(a, "cl", NULL));
  ASSERT_OK(mgpu_store_disconnect(a));
  ASSERT_OK(mgpu_store_disconnect(b));
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

/* ---- capacity and eviction ---- */

TEST_IMPL(capacity_evicts_lru) {
  store_env env;
  store_env_init(&env);
  store_daemon_start(&env, 1 * MIB);
  int ndev = test_init();
  mgpu_store *st;
  ASSERT_OK(mgpu_store_connect(&st, env.path));
  mgpu_store_object *o[3], *held, *x;
  const char *names[3] = {"a", "b", "c"};
  for (int i = 0; i < 2; i++) {
    ASSERT_OK(mgpu_store_create(st, 0, 400 * 1024, names[i], &o[i]));
    ASSERT_OK(mgpu_store_seal(o[i]));
    ASSERT_OK(mgpu_store_release(o[i]));
  }
  /* "a" is used again, so "b" is the least recently used. */
  ASSERT_OK(mgpu_store_get_by_name(st, "a", &held));
  ASSERT_OK(mgpu_store_release(held));
  ASSERT_OK(mgpu_store_create(st, 0, 400 * 1024, names[2], &o[2]));
  ASSERT_ERR(MGPU_ENOENT, mgpu_store_get_by_name(st, "b", &x));
  ASSERT_OK(mgpu_store_get_by_name(st, "a", &held));
  /* "a" is held and "c" unsealed: nothing can go, so 600 KiB does not
   * fit, and the detail says why. Other devices (where there are) are not
   * touched. */
  ASSERT_ERR(MGPU_ENOMEM, mgpu_store_create(st, 0, 600 * 1024, NULL, &x));
  ASSERT_DETAIL_HAS("capacity 1048576");
  ASSERT_DETAIL_HAS("held");
  if (ndev >= 2 && !same_gpu(0, 1))
    ASSERT_OK(mgpu_store_create(st, 1, 600 * 1024, NULL, &x));
  mgpu_store_stats s = {.size = sizeof s};
  ASSERT_OK(mgpu_store_stats_get(st, &s));
  ASSERT_EQ(s.evictions, 1);
  ASSERT_EQ(s.devices[0].capacity, MIB);
  ASSERT_EQ(s.devices[0].in_use, 800 * 1024);
  ASSERT_OK(mgpu_store_disconnect(st)); /* aborts "c" and x, drops "a" */
  store_expect_counts(&env, 1, 0);
  store_down(&env);
  return 0;
}

/* ---- eight clients at once ---- */

static int busy_main(store_env *env, void *arg) {
  int me = *(int *)arg;
  ASSERT_OK(mgpu_init(NULL));
  int ndev = mgpu_device_count();
  mgpu_store *st;
  ASSERT_OK(mgpu_store_connect(&st, env->path));
  char name[32];
  for (int i = 0; i < 1000; i++) {
    mgpu_store_object *o, *g;
    snprintf(name, sizeof name, "c%d-%d", me, i % 5);
    size_t size = 64 + (size_t)(i % 7) * 1000;
    int rc = mgpu_store_create(st, (me + i) % ndev, size, name, &o);
    if (rc != 0) {
      fprintf(stderr, "client %d op %d: %s %s\n", me, i, mgpu_err_name(rc),
              mgpu_error_detail());
      return 1;
    }
    uint8_t byte = (uint8_t)(me * 16 + i % 16), back[2];
    uint8_t h[8192];
    memset(h, byte, size);
    ASSERT_OK(mgpu_memcpy_htod(mgpu_store_object_buffer(o), 0, h, size));
    ASSERT_OK(mgpu_store_seal(o));
    ASSERT_OK(mgpu_store_get_by_name(st, name, &g));
    mgpu_buffer *gb = mgpu_store_object_buffer(g);
    ASSERT_OK(mgpu_memcpy_dtoh(&back[0], gb, 0, 1));
    ASSERT_OK(mgpu_memcpy_dtoh(&back[1], gb, size - 1, 1));
    ASSERT(back[0] == byte && back[1] == byte);
    ASSERT_OK(mgpu_store_delete_by_name(st, name, NULL));
    ASSERT_OK(mgpu_store_release(g));
    ASSERT_OK(mgpu_store_release(o));
  }
  ASSERT_OK(mgpu_store_disconnect(st));
  return 0;
}

TEST_IMPL(eight_clients) {
  store_env env;
  store_env_init(&env);
  store_daemon_start(&env, 0);
  pid_t pids[8];
  int ids[8];
  for (int i = 0; i < 8; i++) {
    ids[i] = i;
    pids[i] = store_spawn(busy_main, &env, &ids[i]);
  }
  for (int i = 0; i < 8; i++) ASSERT_CHILD_OK(pids[i], 240000);
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

/* ---- kill -9 of clients ---- */

typedef struct victim_args {
  int ready; /* pipe end: the victim says it is in place */
  int what;  /* 0 in create (unsealed), 1 holding a get, 2 in a mirror,
                3 looping creates and gets */
} victim_args;

static int victim_main(store_env *env, void *arg) {
  victim_args *a = arg;
  ASSERT_OK(mgpu_init(NULL));
  mgpu_store *st;
  mgpu_store_object *o, *g;
  ASSERT_OK(mgpu_store_connect(&st, env->path));
  void *host;
  switch (a->what) {
    case 0:
      ASSERT_OK(mgpu_store_create(st, store_dev(1), MIB, "unsealed", &o));
      break;
    case 1:
      ASSERT_OK(mgpu_store_get_by_name(st, "kept", &g));
      break;
    case 2:
      ASSERT_OK(mgpu_store_get_by_name(st, "kept", &g));
      ASSERT_OK(mgpu_store_mirror_begin(g, 1, &host));
      break;
    default:
      store_signal(a->ready);
      for (int i = 0;; i++) {
        if (mgpu_store_create(st, store_dev(i), 4096, NULL, &o) != 0)
          return 1;
        if (i % 2 == 0 && mgpu_store_seal(o) != 0) return 1;
        if (i % 3 == 0 && mgpu_store_get_by_name(st, "kept", &g) != 0)
          return 1;
      }
  }
  store_signal(a->ready);
  for (;;) pause();
}

TEST_IMPL(kill_clients) {
  store_env env;
  store_env_init(&env);
  store_daemon_start(&env, 0);
  /* The victims are forked: this process stays uninitialized. */
  share_args kept = {.size = 8192, .seed = 1, .dev = 0, .name = "kept"};
  ASSERT_CHILD_OK(store_spawn(creator_main, &env, &kept), 60000);
  mgpu_store *st;
  for (int what = 0; what < 4; what++) {
    int p[2];
    ASSERT(pipe(p) == 0);
    victim_args a = {p[1], what};
    pid_t pid = store_spawn(victim_main, &env, &a);
    ASSERT_OK(store_await(p[0], 30000));
    if (what == 3) store_sleep_ms(50); /* in the middle of its loop */
    kill(pid, SIGKILL);
    int status = store_wait(pid, 10000);
    ASSERT(status != -1 && WIFSIGNALED(status));
    close(p[0]);
    close(p[1]);
    /* Everything it held or had not sealed is gone; "kept" and the
     * objects it sealed (what == 3) stay, unreferenced. */
    if (what < 3) store_expect_counts(&env, 1, 0);
  }
  mgpu_store_stats s = {.size = sizeof s};
  for (int i = 0; i < 400; i++) {
    ASSERT_OK(mgpu_store_connect(&st, env.path));
    ASSERT_OK(mgpu_store_stats_get(st, &s));
    if (s.refs == 0 && s.clients == 1) break;
    ASSERT_OK(mgpu_store_disconnect(st));
    store_sleep_ms(10);
  }
  ASSERT_EQ(s.refs, 0);
  ASSERT_EQ(s.clients, 1);
  mgpu_store_entry *e;
  size_t n;
  ASSERT_OK(mgpu_store_list(st, &e, &n));
  for (size_t i = 0; i < n; i++) {
    ASSERT(e[i].sealed); /* unsealed ones were aborted */
    ASSERT_OK(mgpu_store_delete(st, e[i].id, NULL));
  }
  mgpu_store_list_free(e);
  ASSERT_OK(mgpu_store_disconnect(st));
  store_expect_counts(&env, 0, 0);
  ASSERT(store_log_has(&env, "disconnected"));
  store_down(&env);
  return 0;
}

/* ---- the daemon dies under connected clients ---- */

TEST_IMPL(daemon_restart) {
  store_env env;
  store_up(&env);
  mgpu_store *st;
  mgpu_store_object *o, *g, *x;
  ASSERT_OK(mgpu_store_connect(&st, env.path));
  ASSERT_OK(mgpu_store_create(st, store_dev(3), 65536, "survivor", &o));
  obj_fill(o, 9);
  ASSERT_OK(mgpu_store_seal(o));
  ASSERT_OK(mgpu_store_get_by_name(st, "survivor", &g));
  kill(env.daemon, SIGKILL);
  ASSERT(store_wait(env.daemon, 10000) != -1);
  env.daemon = 0;
  /* Every call now says the daemon is gone, at once, and keeps saying it. */
  ASSERT_ERR(MGPU_ESTORE, mgpu_store_get_by_name(st, "survivor", &x));
  ASSERT_DETAIL_HAS(env.path);
  ASSERT_ERR(MGPU_ESTORE, mgpu_store_create(st, 0, 10, NULL, &x));
  mgpu_store_stats s = {.size = sizeof s};
  ASSERT_ERR(MGPU_ESTORE, mgpu_store_stats_get(st, &s));
  /* What was mapped stays readable until released. */
  ASSERT(obj_check(g, 9));
  ASSERT_ERR(MGPU_ESTORE, mgpu_store_release(g));
  ASSERT(obj_check(o, 9));
  /* A new daemon on the same path; the old connection stays dead. */
  store_daemon_start(&env, 0);
  ASSERT_ERR(MGPU_ESTORE, mgpu_store_get_by_name(st, "survivor", &x));
  mgpu_store *st2;
  ASSERT_OK(mgpu_store_connect(&st2, env.path));
  ASSERT_ERR(MGPU_ENOENT, mgpu_store_get_by_name(st2, "survivor", &x));
  ASSERT_OK(mgpu_store_create(st2, store_dev(3), 100, "survivor", &x));
  ASSERT_OK(mgpu_store_disconnect(st)); /* releases o locally */
  ASSERT_OK(mgpu_store_disconnect(st2));
  /* A second daemon on a live path is refused. */
  store_env other = env;
  pid_t second = store_daemon_exec(&other, 0);
  int status = store_wait(second, 30000);
  ASSERT(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 1);
  char serving[160];
  snprintf(serving, sizeof serving, "a daemon is already serving %s (pid %d)",
           env.path, (int)env.daemon);
  ASSERT(store_log_has(&env, serving));
  ASSERT(store_log_has(&env, "MGPU_EALREADY"));
  store_expect_counts(&env, 0, 0);
  store_daemon_stop(&env);
  /* No daemon at all: a clear error, no hang. */
  ASSERT_ERR(MGPU_ESTORE, mgpu_store_connect(&st, env.path));
  ASSERT_DETAIL_HAS("no store daemon");
  store_env_cleanup(&env);
  return 0;
}

/* ---- another user ---- */

static int stranger_main(store_env *env, void *arg) {
  (void)arg;
  struct passwd *pw = getpwnam("nobody");
  if (pw == NULL || setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0)
    return 3;
  mgpu_store *st;
  int rc = mgpu_store_connect(&st, env->path);
  if (rc != MGPU_EACCES) {
    fprintf(stderr, "stranger: %s: %s\n", mgpu_err_name(rc),
            mgpu_error_detail());
    return 1;
  }
  return strstr(mgpu_error_detail(), "serves uid") != NULL ? 0 : 2;
}

TEST_IMPL(other_user_refused) {
  if (geteuid() != 0 || getpwnam("nobody") == NULL) return TEST_SKIP;
  store_env env;
  store_env_init(&env);
  store_daemon_start(&env, 0);
  /* Open the way on purpose: only the daemon's uid check stands. */
  ASSERT(chmod(env.dir, 0755) == 0);
  ASSERT(chmod(env.path, 0666) == 0);
  ASSERT_CHILD_OK(store_spawn(stranger_main, &env, NULL), 30000);
  ASSERT(store_log_has(&env, "refused client"));
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

/* ---- malformed and truncated messages ---- */

static int raw_connect(store_env *env) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", env->path);
  ASSERT(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  return fd;
}

/* Sends the bytes and expects the daemon to close the connection. */
static void expect_closed(store_env *env, const void *bytes, size_t n,
                          const char *logged) {
  int fd = raw_connect(env);
  ASSERT(send(fd, bytes, n, MSG_NOSIGNAL) == (ssize_t)n);
  struct pollfd p = {fd, POLLIN, 0};
  char buf[4096];
  for (;;) {
    ASSERT(poll(&p, 1, 10000) == 1);
    ssize_t r = recv(fd, buf, sizeof buf, 0);
    if (r <= 0) break; /* closed */
  }
  close(fd);
  for (int i = 0; i < 200 && !store_log_has(env, logged); i++)
    store_sleep_ms(10);
  if (!store_log_has(env, logged)) {
    fprintf(stderr, "daemon log lacks \"%s\"\n", logged);
    abort();
  }
}

TEST_IMPL(malformed_messages) {
  store_env env;
  store_up(&env);
  /* A good client holds an object throughout: nothing below may harm it. */
  mgpu_store *good;
  mgpu_store_object *o;
  ASSERT_OK(mgpu_store_connect(&good, env.path));
  ASSERT_OK(mgpu_store_create(good, 0, 4096, "good", &o));
  expect_closed(&env, "GARBAGE-GARBAGE-GARBAGE", 23, "bad magic");
  uint8_t v9[16] = {'M', 'G', 'S', 'T', 9, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0};
  expect_closed(&env, v9, sizeof v9, "unknown protocol version 9");
  uint8_t huge[16] = {'M', 'G', 'S', 'T', 1, 0, 1, 0, 1, 0, 0, 0,
                      0, 0, 0, 0x40};
  expect_closed(&env, huge, sizeof huge, "over the maximum");
  /* Not a hello first. */
  mgpu__store_wbuf w = {0};
  mgpu__store_wbuf_begin(&w, MGPU__SM_STATS, 1);
  ASSERT_OK(mgpu__store_wbuf_end(&w));
  expect_closed(&env, w.data, w.len, "not hello");
  mgpu__store_wbuf_free(&w);
  /* A hello, then a create whose field is cut short. */
  mgpu__store_wbuf_begin(&w, MGPU__SM_HELLO, 1);
  mgpu__store_put_u32(&w, 1);
  ASSERT_OK(mgpu__store_wbuf_end(&w));
  mgpu__store_wbuf_begin(&w, MGPU__SM_CREATE, 2);
  mgpu__store_put_u16(&w, 30); /* a 30-byte uuid that is not there */
  mgpu__store_put_bytes(&w, "abc", 3);
  ASSERT_OK(mgpu__store_wbuf_end(&w));
  expect_closed(&env, w.data, w.len, "bad or truncated field 'device uuid'");
  mgpu__store_wbuf_free(&w);
  /* A message cut short by the client's end: the daemon notices. */
  mgpu__store_wbuf_begin(&w, MGPU__SM_HELLO, 1);
  mgpu__store_put_u32(&w, 1);
  ASSERT_OK(mgpu__store_wbuf_end(&w));
  int fd = raw_connect(&env);
  ASSERT(send(fd, w.data, w.len - 2, MSG_NOSIGNAL) == (ssize_t)w.len - 2);
  close(fd);
  for (int i = 0; i < 200 && !store_log_has(&env, "middle of a message"); i++)
    store_sleep_ms(10);
  ASSERT(store_log_has(&env, "middle of a message"));
  mgpu__store_wbuf_free(&w);
  /* The good client never noticed. */
  ASSERT_OK(mgpu_store_seal(o));
  mgpu_store_object *g;
  ASSERT_OK(mgpu_store_get_by_name(good, "good", &g));
  ASSERT_OK(mgpu_store_release(g));
  ASSERT_OK(mgpu_store_release(o));
  ASSERT_OK(mgpu_store_delete_by_name(good, "good", NULL));
  ASSERT_OK(mgpu_store_disconnect(good));
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}


/* ---- a got object is a buffer every mgpu call accepts, read-only ---- */

static void release_count(void *ptr, size_t size, void *arg) {
  (void)ptr;
  (void)size;
  (*(int *)arg)++;
}

TEST_IMPL(buffer_wrap) {
  test_init();
  /* The memory wrapped is device 0's: a static array on a host device, an
   * allocation of the device elsewhere (its kernels reach nothing else). */
  static int32_t host_mem[256];
  int32_t *mem = host_mem;
  mgpu_buffer *backing = NULL;
  mgpu_device_props p0 = {.size = sizeof p0};
  ASSERT_OK(mgpu_device_get_props(0, &p0));
  if (p0.backend_kind != MGPU_BACKEND_HOST) {
    ASSERT_OK(mgpu_malloc(&backing, 0, sizeof host_mem));
    mem = mgpu_buffer_ptr(backing);
    ASSERT(mem != NULL);
  }
  int released = 0;
  mgpu_buffer *w, *r, *src;
  ASSERT_OK(mgpu_buffer_wrap(&w, 0, MGPU_MEM_DEVICE, mem, sizeof host_mem, 0,
                             release_count, &released));
  ASSERT_EQ(mgpu_buffer_is_readonly(w), 0);
  ASSERT(mgpu_buffer_ptr(w) == mem);
  mgpu_stream *s;
  ASSERT_OK(mgpu_stream_create(&s, 0));
  int32_t seven = 7, last = 0;
  ASSERT_OK(mgpu_fill(s, w, 0, 256, MGPU_INT32, &seven));
  ASSERT_OK(mgpu_stream_synchronize(s));
  ASSERT_OK(mgpu_memcpy_dtoh(&last, w, 255 * sizeof last, sizeof last));
  ASSERT_EQ(last, 7);
  if (backing == NULL) ASSERT_EQ(host_mem[255], 7);
  ASSERT_OK(mgpu_buffer_wrap(&r, 0, MGPU_MEM_DEVICE, mem, sizeof host_mem,
                             MGPU_BUFFER_READONLY, NULL, NULL));
  ASSERT_EQ(mgpu_buffer_is_readonly(r), 1);
  ASSERT_OK(mgpu_malloc(&src, 0, sizeof host_mem));
  ASSERT_ERR(MGPU_EREADONLY, mgpu_fill(s, r, 0, 1, MGPU_INT32, &seven));
  ASSERT_DETAIL_HAS("read-only");
  ASSERT_ERR(MGPU_EREADONLY, mgpu_memcpy_htod(r, 0, &seven, 4));
  ASSERT_ERR(MGPU_EREADONLY, mgpu_memcpy(r, 0, src, 0, 4));
  ASSERT_ERR(MGPU_EREADONLY, mgpu_memset_async(r, 0, 0, 4, s));
  ASSERT_ERR(MGPU_EREADONLY, mgpu_scale(s, r, 0, 1, MGPU_INT32, 2.0));
  ASSERT_OK(mgpu_memcpy(src, 0, r, 0, sizeof host_mem)); /* reading is fine */
  int32_t back[256];
  ASSERT_OK(mgpu_memcpy_dtoh(back, src, 0, sizeof back));
  ASSERT_EQ(back[100], 7);
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_wrap(&r, 0, MGPU_MEM_DEVICE, NULL, 4,
                                           0, NULL, NULL));
  ASSERT_ERR(MGPU_EINVAL, mgpu_buffer_wrap(&r, 0, MGPU_MEM_DEVICE, mem, 4,
                                           0x80, NULL, NULL));
  ASSERT_OK(mgpu_free(w));
  ASSERT_EQ(released, 1);
  ASSERT_ERR(MGPU_EFREED, mgpu_free(w));
  ASSERT_EQ(released, 1);
  ASSERT_OK(mgpu_free(src));
  ASSERT_OK(mgpu_stream_destroy(s));
  if (backing != NULL) ASSERT_OK(mgpu_free(backing));
  return 0;
}

TEST_IMPL(object_buffers) {
  store_env env;
  store_env_init(&env);
  store_daemon_start(&env, 0);
  int ndev = test_init();
  /* Parts of one GPU: the object got back is on device 0, which the rest
   * of the test uses as another device than the object's. */
  if (ndev < 2 || same_gpu(0, 1)) {
    store_daemon_stop(&env);
    store_env_cleanup(&env);
    return TEST_SKIP;
  }
  mgpu_store *a, *b;
  ASSERT_OK(mgpu_store_connect(&a, env.path));
  ASSERT_OK(mgpu_store_connect(&b, env.path));
  enum { N = 4096 };
  mgpu_store_object *o, *g;
  ASSERT_OK(mgpu_store_create(a, 1, N * sizeof(float), "vec", &o));
  mgpu_buffer *ob = mgpu_store_object_buffer(o);
  ASSERT(ob != NULL);
  ASSERT_EQ(mgpu_buffer_device(ob), 1);
  ASSERT_EQ(mgpu_buffer_is_readonly(ob), 0);
  mgpu_stream *s1, *s0;
  ASSERT_OK(mgpu_stream_create(&s1, 1));
  ASSERT_OK(mgpu_stream_create(&s0, 0));
  float three = 3.0f;
  ASSERT_OK(mgpu_fill(s1, ob, 0, N, MGPU_FLOAT32, &three));
  ASSERT_OK(mgpu_scale(s1, ob, 0, N, MGPU_FLOAT32, 2.0));
  ASSERT_OK(mgpu_stream_synchronize(s1));
  ASSERT_OK(mgpu_store_seal(o));
  ASSERT_EQ(mgpu_buffer_is_readonly(ob), 1);
  ASSERT_ERR(MGPU_EREADONLY, mgpu_fill(s1, ob, 0, N, MGPU_FLOAT32, &three));
  ASSERT_OK(mgpu_store_get_by_name(b, "vec", &g));
  mgpu_buffer *gb = mgpu_store_object_buffer(g);
  ASSERT_EQ(mgpu_buffer_device(gb), 1);
  ASSERT_EQ(mgpu_buffer_size(gb), N * sizeof(float));
  /* Read by a copy to another device, a kernel and a copy to the host. */
  mgpu_buffer *d0, *acc;
  ASSERT_OK(mgpu_malloc(&d0, 0, N * sizeof(float)));
  ASSERT_OK(mgpu_malloc(&acc, 1, N * sizeof(float)));
  ASSERT_OK(mgpu_memcpy(d0, 0, gb, 0, N * sizeof(float)));
  float zero = 0.0f;
  ASSERT_OK(mgpu_fill(s1, acc, 0, N, MGPU_FLOAT32, &zero));
  ASSERT_OK(mgpu_axpy(s1, acc, 0, gb, 0, N, MGPU_FLOAT32, 0.5));
  ASSERT_OK(mgpu_stream_synchronize(s1));
  static float h[N];
  ASSERT_OK(mgpu_memcpy_dtoh(h, d0, 0, sizeof h));
  ASSERT(h[0] == 6.0f && h[N - 1] == 6.0f);
  ASSERT_OK(mgpu_memcpy_dtoh(h, acc, 0, sizeof h));
  ASSERT(h[0] == 3.0f && h[N / 2] == 3.0f);
  ASSERT_OK(mgpu_memcpy_dtoh(h, gb, 0, sizeof h));
  ASSERT(h[N - 1] == 6.0f);
  /* A collective reads it as a send buffer and refuses it as recv. */
  int devs[2] = {1, 0};
  mgpu_comm *comm;
  ASSERT_OK(mgpu_comm_create(devs, 2, &comm));
  mgpu_buffer *r1;
  ASSERT_OK(mgpu_malloc(&r1, 1, N * sizeof(float)));
  ASSERT_OK(mgpu_group_begin());
  ASSERT_OK(mgpu_allreduce(comm, 0, gb, r1, N, MGPU_FLOAT32, MGPU_SUM, s1));
  ASSERT_OK(mgpu_allreduce(comm, 1, d0, d0, N, MGPU_FLOAT32, MGPU_SUM, s0));
  ASSERT_OK(mgpu_group_end());
  ASSERT_OK(mgpu_stream_synchronize(s1));
  ASSERT_OK(mgpu_stream_synchronize(s0));
  ASSERT_OK(mgpu_memcpy_dtoh(h, r1, 0, sizeof h));
  ASSERT(h[0] == 12.0f && h[N - 1] == 12.0f);
  ASSERT_ERR(MGPU_EREADONLY, mgpu_allreduce(comm, 0, r1, gb, N, MGPU_FLOAT32,
                                            MGPU_SUM, s1));
  ASSERT_OK(mgpu_comm_destroy(comm));
  /* Writes are refused; the bytes are untouched. */
  ASSERT_ERR(MGPU_EREADONLY, mgpu_memcpy(gb, 0, d0, 0, 4));
  ASSERT_ERR(MGPU_EREADONLY, mgpu_memcpy_htod(gb, 0, h, 4));
  ASSERT_ERR(MGPU_EREADONLY, mgpu_elementwise(s1, gb, 0, acc, 0, acc, 0, N,
                                              MGPU_FLOAT32, MGPU_SUM));
  ASSERT_OK(mgpu_stream_destroy(s1));
  ASSERT_OK(mgpu_stream_destroy(s0));
  ASSERT_OK(mgpu_free(d0));
  ASSERT_OK(mgpu_free(acc));
  ASSERT_OK(mgpu_free(r1));
  ASSERT_OK(mgpu_store_release(o));
  ASSERT_OK(mgpu_store_delete_by_name(a, "vec", NULL));
  ASSERT_OK(mgpu_store_disconnect(a));
  ASSERT_OK(mgpu_store_disconnect(b)); /* releases g */
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

/* ---- raw clients: the protocol spoken by hand ---- */

/* Reads exactly n bytes from sock (10 s at most); a descriptor that comes
 * along lands in *fd. */
static void raw_recv(int sock, uint8_t *buf, size_t n, int *fd) {
  while (n > 0) {
    struct pollfd p = {sock, POLLIN, 0};
    ASSERT(poll(&p, 1, 10000) == 1);
    struct iovec iov = {buf, n};
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1,
                        .msg_control = ctl.buf,
                        .msg_controllen = sizeof ctl.buf};
    ssize_t r = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    ASSERT(r > 0);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    if (cm != NULL && cm->cmsg_type == SCM_RIGHTS)
      memcpy(fd, CMSG_DATA(cm), sizeof *fd);
    buf += r;
    n -= (size_t)r;
  }
}

/* Reads one message into *m (free with mgpu__store_msg_free). */
static void raw_reply(int sock, mgpu__store_msg *m, int *fd) {
  static uint8_t buf[MGPU__STORE_MSG_MAX];
  uint32_t plen;
  char why[256];
  raw_recv(sock, buf, MGPU__STORE_HDR, fd);
  ASSERT_OK(mgpu__store_header_check(buf, &plen, why, sizeof why));
  raw_recv(sock, buf + MGPU__STORE_HDR, plen, fd);
  ASSERT_OK(mgpu__store_decode(buf, MGPU__STORE_HDR + plen, m, why,
                               sizeof why));
}

static void raw_send_hello(int sock) {
  mgpu__store_wbuf w = {0};
  mgpu__store_wbuf_begin(&w, MGPU__SM_HELLO, 1);
  mgpu__store_put_u32(&w, (uint32_t)getpid());
  ASSERT_OK(mgpu__store_wbuf_end(&w));
  ASSERT(send(sock, w.data, w.len, MSG_NOSIGNAL) == (ssize_t)w.len);
  mgpu__store_wbuf_free(&w);
  mgpu__store_msg m;
  int fd = -1;
  raw_reply(sock, &m, &fd);
  ASSERT_EQ(m.type, MGPU__SM_HELLO | MGPU__SM_REPLY);
  mgpu__store_msg_free(&m);
}

static void raw_put_get(mgpu__store_wbuf *w, const char *name, uint32_t seq) {
  mgpu__store_wbuf_begin(w, MGPU__SM_GET, seq);
  mgpu__store_put_u64(w, 0);
  mgpu__store_put_str(w, name, 255);
  ASSERT_OK(mgpu__store_wbuf_end(w));
}

/* ---- a sealed object cannot be written by anyone ---- */

/* A reader holding the read-only descriptor of a sealed object tries every
 * way to write it; each must fail. */
static int writer_main(store_env *env, void *arg) {
  (void)arg;
  int sock = raw_connect(env);
  raw_send_hello(sock);
  mgpu__store_wbuf w = {0};
  raw_put_get(&w, "sealed", 2);
  ASSERT(send(sock, w.data, w.len, MSG_NOSIGNAL) == (ssize_t)w.len);
  mgpu__store_wbuf_free(&w);
  mgpu__store_msg m;
  int fd = -1;
  raw_reply(sock, &m, &fd);
  ASSERT_EQ(m.type, MGPU__SM_GET | MGPU__SM_REPLY);
  ASSERT(fd >= 0);
  size_t n = m.obj.map_size;
  mgpu__store_msg_free(&m);
  ASSERT(mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) ==
         MAP_FAILED);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int rw = open(path, O_RDWR);
  if (rw >= 0) {
    /* The reopen is allowed (a memfd lets everyone open it); what it
     * could change is not. */
    ASSERT(pwrite(rw, "XXXX", 4, 0) < 0);
    ASSERT(write(rw, "XXXX", 4) < 0);
    ASSERT(mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0) ==
           MAP_FAILED);
    ASSERT(fallocate(rw, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                     4096) != 0);
    ASSERT(ftruncate(rw, 0) != 0);
    ASSERT(fcntl(rw, F_ADD_SEALS, F_SEAL_WRITE) != 0); /* seals are final */
    close(rw);
  }
  /* A read-only mapping cannot be made writable either. */
  void *ro = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT(ro != MAP_FAILED);
  ASSERT(mprotect(ro, n, PROT_READ | PROT_WRITE) != 0);
  munmap(ro, n);
  close(fd);
  close(sock);
  return 0;
}

TEST_IMPL(sealed_memory_immutable) {
  store_env env;
  store_up(&env);
  mgpu_store *st;
  mgpu_store_object *o, *g;
  ASSERT_OK(mgpu_store_connect(&st, env.path));
  ASSERT_OK(mgpu_store_create(st, 0, 3 * 4096 + 5, "sealed", &o));
  if (!on_host_device(o)) {
    ASSERT_OK(mgpu_store_disconnect(st));
    store_daemon_stop(&env);
    store_env_cleanup(&env);
    return TEST_SKIP;
  }
  obj_fill(o, 21);
  ASSERT_OK(mgpu_store_seal(o));
  /* Forked from an initialized process, the writer ends with _exit: what
   * it inherited is not its to free (nor LeakSanitizer's to report). */
  fflush(NULL);
  pid_t writer = fork();
  ASSERT(writer >= 0);
  if (writer == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    _exit(writer_main(&env, NULL));
  }
  ASSERT_CHILD_OK(writer, 30000);
  /* The creator's own mapping cannot be made writable again. */
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  ASSERT(mprotect(mgpu_store_object_ptr(o), page, PROT_READ | PROT_WRITE) !=
         0);
  /* Every holder still reads what was sealed. */
  ASSERT(obj_check(o, 21));
  ASSERT_OK(mgpu_store_get_by_name(st, "sealed", &g));
  ASSERT(obj_check(g, 21));
  ASSERT_OK(mgpu_store_release(g));
  ASSERT_OK(mgpu_store_release(o));
  ASSERT_OK(mgpu_store_delete_by_name(st, "sealed", NULL));
  ASSERT_OK(mgpu_store_disconnect(st));
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

/* ---- two daemons started at once on one path ---- */

TEST_IMPL(racing_daemons) {
  store_env env;
  store_env_init(&env);
  for (int round = 0; round < 20; round++) {
    pid_t a = store_daemon_exec(&env, 0), b = store_daemon_exec(&env, 0);
    /* Exactly one gives up, with MGPU_EALREADY; the other serves. */
    pid_t loser = 0;
    int status = 0;
    for (int i = 0; i < 2000 && loser == 0; i++) {
      if (waitpid(a, &status, WNOHANG) == a) loser = a;
      else if (waitpid(b, &status, WNOHANG) == b) loser = b;
      else store_sleep_ms(5);
    }
    if (loser == 0) {
      fprintf(stderr, "round %d: both daemons still run\n", round);
      kill(a, SIGKILL);
      kill(b, SIGKILL);
      store_wait(a, 5000);
      store_wait(b, 5000);
      abort();
    }
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    env.daemon = loser == a ? b : a;
    mgpu_store *st;
    ASSERT_OK(store_connect_wait(&env, &st));
    mgpu_store_stats s = {.size = sizeof s};
    ASSERT_OK(mgpu_store_stats_get(st, &s));
    ASSERT_EQ(s.clients, 1);
    ASSERT_OK(mgpu_store_disconnect(st));
    ASSERT_EQ(waitpid(env.daemon, &status, WNOHANG), 0); /* still serving */
    store_daemon_stop(&env);
    struct stat sb;
    ASSERT(lstat(env.path, &sb) != 0); /* socket and lock removed */
    char lock[128];
    snprintf(lock, sizeof lock, "%s.lock", env.path);
    ASSERT(lstat(lock, &sb) != 0);
  }
  ASSERT(store_log_has(&env, "a daemon is already serving"));
  ASSERT(!store_log_has(&env, "already initialized\n"));
  store_env_cleanup(&env);
  return 0;
}

/* ---- a disconnect while other threads are inside calls ---- */

typedef struct busy_thread {
  mgpu_store *st;
  _Atomic int *calls;
  int last_rc;
  char detail[512]; /* the failed call's detail */
} busy_thread;

static void *busy_thread_main(void *arg) {
  busy_thread *t = arg;
  for (;;) {
    mgpu_store_object *o = NULL, *g = NULL;
    mgpu_store_stats s = {.size = sizeof s};
    uint64_t id = 0;
    int rc = mgpu_store_create(t->st, 0, 4096, NULL, &o);
    /* Once the disconnect has begun, o may be gone: id 0 says so. */
    if (rc == 0 && (id = mgpu_store_object_id(o)) == 0) rc = MGPU_EFREED;
    if (rc == 0) rc = mgpu_store_seal(o);
    if (rc == 0) rc = mgpu_store_get(t->st, id, &g);
    if (rc == 0) rc = mgpu_store_stats_get(t->st, &s);
    if (rc == 0) rc = mgpu_store_delete(t->st, id, NULL);
    if (rc == 0) rc = mgpu_store_release(g);
    if (rc == 0) rc = mgpu_store_release(o);
    if (rc != 0) {
      t->last_rc = rc;
      snprintf(t->detail, sizeof t->detail, "%s", mgpu_error_detail());
      return NULL;
    }
    atomic_fetch_add(t->calls, 1);
  }
}

TEST_IMPL(disconnect_during_calls) {
  store_env env;
  store_up(&env);
  for (int round = 0; round < 5; round++) {
    mgpu_store *st;
    ASSERT_OK(mgpu_store_connect(&st, env.path));
    _Atomic int calls = 0;
    busy_thread t[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
      t[i] = (busy_thread){st, &calls, 0, ""};
      ASSERT(pthread_create(&th[i], NULL, busy_thread_main, &t[i]) == 0);
    }
    /* Threads are inside calls of the connection: close it under them. */
    for (int i = 0; i < 100000 && atomic_load(&calls) < 20; i++)
      store_sleep_ms(1);
    ASSERT(atomic_load(&calls) >= 20);
    ASSERT_OK(mgpu_store_disconnect(st));
    for (int i = 0; i < 4; i++) {
      ASSERT(pthread_join(th[i], NULL) == 0);
      int rc = t[i].last_rc;
      if (rc != MGPU_ESTORE && rc != MGPU_EBADHANDLE && rc != MGPU_EFREED) {
        fprintf(stderr, "thread %d ended with %s: %s\n", i, mgpu_err_name(rc),
                t[i].detail);
        abort();
      }
    }
  }
  /* An object sealed just before its thread's delete was cut off stays,
   * unreferenced: delete what is left. */
  mgpu_store *st;
  mgpu_store_entry *e;
  size_t n;
  ASSERT_OK(mgpu_store_connect(&st, env.path));
  ASSERT_OK(mgpu_store_list(st, &e, &n));
  for (size_t i = 0; i < n; i++) {
    ASSERT(e[i].sealed && e[i].refs == 0);
    ASSERT_OK(mgpu_store_delete(st, e[i].id, NULL));
  }
  mgpu_store_list_free(e);
  ASSERT_OK(mgpu_store_disconnect(st));
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

/* ---- a mapping cut off by a disconnect ---- */

typedef struct get_call {
  mgpu_store *st;
  uint64_t id;
  int rc;
  char detail[512]; /* the failed call's detail */
} get_call;

static void *get_call_main(void *arg) {
  get_call *c = arg;
  mgpu_store_object *o = NULL;
  c->rc = mgpu_store_get(c->st, c->id, &o);
  if (c->rc == 0) mgpu_store_release(o);
  else snprintf(c->detail, sizeof c->detail, "%s", mgpu_error_detail());
  return NULL;
}

/* A get whose mapping fails while a disconnect of its connection is under
 * way fails for the disconnect: MGPU_ESTORE naming it and the mapping's
 * own failure (so does a get over legacy CUDA IPC whose memory the
 * disconnect let go before it was mapped). Without a disconnect, the
 * mapping's own error comes back. Nothing stays at the daemon. */
TEST_IMPL(import_cut_by_disconnect) {
  store_env env;
  store_up(&env);
  mgpu_store *st;
  mgpu_store_object *o, *g;
  ASSERT_OK(mgpu_store_connect(&st, env.path));
  ASSERT_OK(mgpu_store_create(st, 0, 4096, "cut", &o));
  ASSERT_OK(mgpu_store_seal(o));
  uint64_t id = mgpu_store_object_id(o);
  ASSERT_OK(mgpu__fault_set("backend:ipc_import:1", NULL, 0));
  int rc = mgpu_store_get(st, id, &g);
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  if (rc != MGPU_EBACKEND ||
      strstr(mgpu_error_detail(), "ipc_import") == NULL) {
    fprintf(stderr, "get with a failed mapping: %s: %s\n", mgpu_err_name(rc),
            mgpu_error_detail());
    abort();
  }
  /* The get waits between its reply and its mapping; the disconnect comes
   * in that window and waits for the get. */
  get_call c = {st, id, 0, ""};
  ASSERT_OK(mgpu__fault_set("stall:store_import@us:300000,"
                            "backend:ipc_import:1", NULL, 0));
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, get_call_main, &c) == 0);
  /* Bounded: a get that failed before its mapping never stalls. */
  for (int i = 0; i < 10000 && mgpu__fault_stalls() == 0; i++)
    store_sleep_ms(1);
  if (mgpu__fault_stalls() == 0) {
    pthread_join(t, NULL);
    fprintf(stderr, "the get never reached its mapping: %s: %s\n",
            mgpu_err_name(c.rc), c.detail);
    abort();
  }
  ASSERT_OK(mgpu_store_disconnect(st));
  ASSERT(pthread_join(t, NULL) == 0);
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  if (c.rc != MGPU_ESTORE ||
      strstr(c.detail, "closed by mgpu_store_disconnect during the call "
                       "(mapping object") == NULL ||
      strstr(c.detail, "ipc_import") == NULL) {
    fprintf(stderr, "get cut by a disconnect: %s: %s\n", mgpu_err_name(c.rc),
            c.detail);
    abort();
  }
  ASSERT_OK(mgpu_store_connect(&st, env.path));
  ASSERT_OK(mgpu_store_delete_by_name(st, "cut", NULL));
  ASSERT_OK(mgpu_store_disconnect(st));
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

/* ---- a client that never reads its replies ---- */

/* The descriptors open in process pid; with memfd_only, only its
 * shared-memory ones (memfds), what a store object's descriptor is: other
 * descriptors come and go with the library's threads (a device thread
 * reading sysfs as it starts), so a count of all of them is not steady
 * enough to compare in the process that runs the library. */
static int count_fds(pid_t pid, int memfd_only) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(path);
  ASSERT(d != NULL);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char link[384], target[128];
    snprintf(link, sizeof link, "%s/%s", path, e->d_name);
    ssize_t len = readlink(link, target, sizeof target - 1);
    if (len > 0) target[len] = 0;
    n += !memfd_only || (len > 0 && strncmp(target, "/memfd:", 7) == 0);
  }
  closedir(d);
  return n;
}

TEST_IMPL(unread_replies_bounded) {
  store_env env;
  store_up(&env);
  int fds_before = count_fds(env.daemon, 0);
  mgpu_store *good;
  mgpu_store_object *o, *g;
  ASSERT_OK(mgpu_store_connect(&good, env.path));
  ASSERT_OK(mgpu_store_create(good, 0, 4096, "x", &o));
  ASSERT_OK(mgpu_store_seal(o));
  /* The flood: GETs, none of their replies read. Each reply carries a
   * descriptor (memfd, cuMem), which the daemon drops the flooder for in a
   * few dozen, or only bytes (legacy CUDA IPC handles), which it drops it
   * for past some MiB: 100,000 replies are more than either. */
  int sock = raw_connect(&env);
  raw_send_hello(sock);
  mgpu__store_wbuf w = {0};
  for (uint32_t i = 0; i < 100000; i++) raw_put_get(&w, "x", i + 2);
  size_t sent = 0;
  while (sent < w.len) {
    ssize_t r = send(sock, w.data + sent, w.len - sent,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      sent += (size_t)r;
      continue;
    }
    if (r < 0 && errno != EAGAIN) break; /* dropped */
    struct pollfd p = {sock, POLLOUT, 0};
    if (poll(&p, 1, 2000) != 1) break; /* the daemon stopped reading */
  }
  mgpu__store_wbuf_free(&w);
  /* The daemon drops the flooder (it says so) and keeps few descriptors. */
  for (int i = 0; i < 1000 && !store_log_has(&env, "does not read its replies");
       i++)
    store_sleep_ms(10);
  int fds = count_fds(env.daemon, 0);
  if (fds > fds_before + 32) {
    fprintf(stderr, "the daemon holds %d descriptors (%d before)\n", fds,
            fds_before);
    abort();
  }
  ASSERT(store_log_has(&env, "does not read its replies"));
  /* Others are served all along. */
  ASSERT_OK(mgpu_store_get_by_name(good, "x", &g));
  ASSERT_OK(mgpu_store_release(g));
  close(sock);
  ASSERT_OK(mgpu_store_release(o));
  ASSERT_OK(mgpu_store_delete_by_name(good, "x", NULL));
  ASSERT_OK(mgpu_store_disconnect(good));
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

/* ---- nothing is left behind by a closed client or a failed create ---- */

TEST_IMPL(nothing_left_behind) {
  store_env env;
  store_env_init(&env);
  store_daemon_start(&env, 64 * 1024);
  test_init();
  mgpu_store *st;
  mgpu_store_object *o;
  mgpu_store_stats s = {.size = sizeof s};
  /* Released unsealed, then disconnected: the objects go. */
  ASSERT_OK(mgpu_store_connect(&st, env.path));
  for (int i = 0; i < 4; i++) {
    ASSERT_OK(mgpu_store_create(st, 0, 16 * 1024, NULL, &o));
    ASSERT_OK(mgpu_store_release(o));
  }
  ASSERT_OK(mgpu_store_stats_get(st, &s));
  ASSERT_EQ(s.devices[0].in_use, 64 * 1024);
  ASSERT_OK(mgpu_store_disconnect(st));
  store_expect_counts(&env, 0, 0);
  ASSERT_OK(mgpu_store_connect(&st, env.path));
  ASSERT_OK(mgpu_store_create(st, 0, 64 * 1024, NULL, &o)); /* all of it */
  ASSERT_OK(mgpu_store_release(o));
  ASSERT_OK(mgpu_store_disconnect(st));
  store_expect_counts(&env, 0, 0);
  /* Every allocation of a create, failed in turn: no object stays, and
   * no descriptor the daemon sent stays open in this process. */
  ASSERT_OK(mgpu_store_connect(&st, env.path));
  ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
  ASSERT_OK(mgpu_store_create(st, 0, 4096, "f", &o));
  uint64_t sites = mgpu__fault_calls(MGPU__FAULT_ALLOC);
  ASSERT_OK(mgpu_store_release(o));
  ASSERT_OK(mgpu_store_delete_by_name(st, "f", NULL));
  ASSERT(sites > 0);
  int fds = count_fds(getpid(), 1);
  for (uint64_t n = 1; n <= sites; n++) {
    char spec[32];
    snprintf(spec, sizeof spec, "alloc:%llu", (unsigned long long)n);
    ASSERT_OK(mgpu__fault_set(spec, NULL, 0));
    int rc = mgpu_store_create(st, 0, 4096, "f", &o);
    ASSERT_OK(mgpu__fault_set(NULL, NULL, 0));
    if (rc == 0) {
      ASSERT_OK(mgpu_store_release(o));
      ASSERT_OK(mgpu_store_delete_by_name(st, "f", NULL));
    }
    ASSERT_OK(mgpu_store_stats_get(st, &s));
    if (s.objects != 0) {
      fprintf(stderr, "alloc:%llu: create returned %s, %llu objects left\n",
              (unsigned long long)n, mgpu_err_name(rc),
              (unsigned long long)s.objects);
      abort();
    }
    if (count_fds(getpid(), 1) != fds) {
      fprintf(stderr, "alloc:%llu: create returned %s, %d shared-memory "
              "descriptors open where %d were\n", (unsigned long long)n,
              mgpu_err_name(rc), count_fds(getpid(), 1), fds);
      abort();
    }
  }
  ASSERT_OK(mgpu_store_disconnect(st));
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

/* ---- a create that can never fit evicts nothing ---- */

TEST_IMPL(create_never_fits) {
  store_env env;
  store_env_init(&env);
  store_daemon_start(&env, 1 * MIB);
  test_init();
  mgpu_store *st;
  mgpu_store_object *o, *held, *x;
  ASSERT_OK(mgpu_store_connect(&st, env.path));
  const char *names[2] = {"a", "b"};
  for (int i = 0; i < 2; i++) {
    ASSERT_OK(mgpu_store_create(st, 0, 300 * 1024, names[i], &o));
    ASSERT_OK(mgpu_store_seal(o));
    ASSERT_OK(mgpu_store_release(o));
  }
  ASSERT_ERR(MGPU_ENOMEM, mgpu_store_create(st, 0, 2 * MIB, NULL, &x));
  ASSERT_DETAIL_HAS("capacity 1048576");
  ASSERT_ERR(MGPU_ENOMEM, mgpu_store_create(st, 0, SIZE_MAX / 2, NULL, &x));
  /* "a" held: 900 KiB would need it gone, so "b" stays too. */
  ASSERT_OK(mgpu_store_get_by_name(st, "a", &held));
  ASSERT_ERR(MGPU_ENOMEM, mgpu_store_create(st, 0, 900 * 1024, NULL, &x));
  mgpu_store_stats s = {.size = sizeof s};
  ASSERT_OK(mgpu_store_stats_get(st, &s));
  ASSERT_EQ(s.evictions, 0);
  ASSERT_EQ(s.objects, 2);
  ASSERT_OK(mgpu_store_release(held));
  /* What can fit still evicts, least recently used first. */
  ASSERT_OK(mgpu_store_create(st, 0, 600 * 1024, NULL, &x));
  ASSERT_OK(mgpu_store_stats_get(st, &s));
  ASSERT_EQ(s.evictions, 1);
  ASSERT_OK(mgpu_store_release(x));
  ASSERT_OK(mgpu_store_disconnect(st));
  store_expect_counts(&env, 1, 0);
  store_down(&env);
  return 0;
}

/* ---- errors say what happened ---- */

TEST_IMPL(seal_after_delete) {
  store_env env;
  store_up(&env);
  mgpu_store *a, *b;
  mgpu_store_object *o;
  ASSERT_OK(mgpu_store_connect(&a, env.path));
  ASSERT_OK(mgpu_store_connect(&b, env.path));
  ASSERT_OK(mgpu_store_create(a, 0, 4096, "gone", &o));
  ASSERT_OK(mgpu_store_delete_by_name(b, "gone", NULL));
  ASSERT_ERR(MGPU_ENOENT, mgpu_store_seal(o));
  ASSERT_DETAIL_HAS("deleted");
  ASSERT_OK(mgpu_store_release(o));
  ASSERT_OK(mgpu_store_disconnect(a));
  ASSERT_OK(mgpu_store_disconnect(b));
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

/* ---- whom a client trusts (as root, playing two other users) ---- */

#define ATTACKER_UID 65534
#define VICTIM_UID 65533

/* Becomes uid (and gid uid), in the groups given. */
static void become(uid_t uid, gid_t *groups, size_t ngroups) {
  ASSERT(setgroups(ngroups, groups) == 0);
  ASSERT(setgid(uid) == 0);
  ASSERT(setuid(uid) == 0);
}

/* Another user's daemon, in a directory of theirs at the victim's default
 * path, letting the victim's group in. */
static pid_t attacker_daemon(store_env *env, const char *dir,
                             const char *path) {
  pid_t pid = store_fork_logged(env);
  if (pid == 0) {
    /* A member of the victim's group, so it may hand the socket to it. */
    gid_t victims = VICTIM_UID;
    become(ATTACKER_UID, &victims, 1);
    if (mkdir(dir, 0777) != 0 || chmod(dir, 0777) != 0) _exit(126);
    char gid[16];
    snprintf(gid, sizeof gid, "%d", VICTIM_UID);
    /* The test is of trust, not of devices: another user may not open the
     * GPUs the suite runs on. */
    setenv("MGPU_DEVICES", "host:1", 1);
    execl(MGPU_TEST_BIN_DIR "/mgpud", "mgpud", "--socket", path,
          "--allow-group", gid, (char *)NULL);
    _exit(127);
  }
  return pid;
}

typedef struct victim_paths {
  const char *xdg, *path;
} victim_paths;

static int trusting_victim_main(store_env *env, void *arg) {
  (void)env;
  victim_paths *v = arg;
  become(VICTIM_UID, NULL, 0);
  setenv("XDG_RUNTIME_DIR", v->xdg, 1);
  mgpu_store *st;
  int rc = MGPU_ESTORE;
  /* The default path: the directory is not the victim's. */
  for (int i = 0; i < 2000 && rc == MGPU_ESTORE; i++) {
    rc = mgpu_store_connect(&st, NULL);
    if (rc == MGPU_ESTORE) store_sleep_ms(5);
  }
  if (rc != MGPU_EACCES) {
    fprintf(stderr, "default path: %s: %s\n", mgpu_err_name(rc),
            mgpu_error_detail());
    return 1;
  }
  if (strstr(mgpu_error_detail(), "65534") == NULL) {
    fprintf(stderr, "default path: %s\n", mgpu_error_detail());
    return 2;
  }
  /* The same socket named: the daemon runs as another user. */
  rc = MGPU_ESTORE;
  for (int i = 0; i < 2000 && rc == MGPU_ESTORE; i++) {
    rc = mgpu_store_connect(&st, v->path);
    if (rc == MGPU_ESTORE) store_sleep_ms(5);
  }
  if (rc != MGPU_EACCES) {
    fprintf(stderr, "named path: %s: %s\n", mgpu_err_name(rc),
            mgpu_error_detail());
    return 3;
  }
  if (strstr(mgpu_error_detail(), "runs as uid 65534") == NULL) {
    fprintf(stderr, "named path: %s\n", mgpu_error_detail());
    return 4;
  }
  /* Told to trust that user, it connects (the daemon lets its group in). */
  setenv("MGPU_STORE_TRUST", "65534", 1);
  rc = mgpu_store_connect(&st, v->path);
  if (rc != 0) {
    fprintf(stderr, "trusted: %s: %s\n", mgpu_err_name(rc),
            mgpu_error_detail());
    return 5;
  }
  mgpu_store_disconnect(st);
  return 0;
}

TEST_IMPL(untrusted_daemon_refused) {
  if (geteuid() != 0) return TEST_SKIP;
  store_env env;
  store_env_init(&env);
  /* The directory above is shared, as /tmp is. */
  ASSERT(chmod(env.dir, 01777) == 0);
  char dir[128], path[160];
  snprintf(dir, sizeof dir, "%s/mgpu", env.dir);
  snprintf(path, sizeof path, "%s/store.sock", dir);
  env.daemon = attacker_daemon(&env, dir, path);
  victim_paths v = {env.dir, path};
  ASSERT_CHILD_OK(store_spawn(trusting_victim_main, &env, &v), 60000);
  kill(env.daemon, SIGTERM);
  ASSERT_CHILD_OK(env.daemon, 20000);
  env.daemon = 0;
  rmdir(dir);
  store_env_cleanup(&env);
  return 0;
}

static int refused_by_fs_main(store_env *env, void *arg) {
  (void)arg;
  become(ATTACKER_UID, NULL, 0);
  mgpu_store *st;
  int rc = mgpu_store_connect(&st, env->path);
  if (rc != MGPU_EACCES) {
    fprintf(stderr, "%s: %s\n", mgpu_err_name(rc), mgpu_error_detail());
    return 1;
  }
  return strstr(mgpu_error_detail(), env->path) != NULL ? 0 : 2;
}

TEST_IMPL(socket_refused_is_eacces) {
  if (geteuid() != 0) return TEST_SKIP;
  store_env env;
  store_env_init(&env);
  store_daemon_start(&env, 0);
  /* The directory lets others through; the socket (0600) does not. */
  ASSERT(chmod(env.dir, 0755) == 0);
  ASSERT_CHILD_OK(store_spawn(refused_by_fs_main, &env, NULL), 30000);
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

/* ---- a daemon out of descriptors refuses, and recovers ---- */

TEST_IMPL(descriptors_exhausted) {
  store_env env;
  store_env_init(&env);
  /* A daemon allowed few descriptors beyond those it holds once started
   * (a CUDA driver holds dozens), so that clients can use them up. */
  store_daemon_start(&env, 0);
  int held = count_fds(env.daemon, 0);
  ASSERT(held > 0);
  store_daemon_stop(&env);
  rlim_t limit = held + 40 > 48 ? (rlim_t)held + 40 : 48;
  env.daemon = store_fork_logged(&env);
  if (env.daemon == 0) {
    struct rlimit lim = {limit, limit};
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) _exit(126);
    execl(MGPU_TEST_BIN_DIR "/mgpud", "mgpud", "--socket", env.path,
          (char *)NULL);
    _exit(127);
  }
  mgpu_store *first;
  ASSERT_OK(store_connect_wait(&env, &first));
  enum { MAX = 64 };
  mgpu_store *st[MAX];
  int n = 0, rc = 0;
  while (n < MAX && (rc = mgpu_store_connect(&st[n], env.path)) == 0) n++;
  /* The client over the limit is told at once (the daemon closes it), and
   * the daemon says why. */
  ASSERT(n < MAX);
  ASSERT_EQ(rc, MGPU_ESTORE);
  ASSERT_DETAIL_HAS(env.path);
  ASSERT(store_log_has(&env, "out of file descriptors"));
  /* The clients it took are served, and room comes back. */
  mgpu_store_stats s = {.size = sizeof s};
  ASSERT_OK(mgpu_store_stats_get(first, &s));
  ASSERT_EQ(s.clients, (uint32_t)n + 1);
  for (int i = 0; i < n; i++) ASSERT_OK(mgpu_store_disconnect(st[i]));
  ASSERT_OK(mgpu_store_disconnect(first));
  store_expect_counts(&env, 0, 0);
  store_down(&env);
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(proto_roundtrip)
TEST_ENTRY(import_map_counts_references)
TEST_ENTRY(proto_rejects)
TEST_ENTRY(share_two_processes)
TEST_ENTRY(lifetimes)
TEST_ENTRY(mirror)
TEST_ENTRY(opencl_objects_in_host_memory)
TEST_ENTRY(capacity_evicts_lru)
TEST_ENTRY(eight_clients)
TEST_ENTRY(kill_clients)
TEST_ENTRY(daemon_restart)
TEST_ENTRY(other_user_refused)
TEST_ENTRY(malformed_messages)
TEST_ENTRY(buffer_wrap)
TEST_ENTRY(object_buffers)
TEST_ENTRY(sealed_memory_immutable)
TEST_ENTRY(racing_daemons)
TEST_ENTRY(disconnect_during_calls)
TEST_ENTRY(import_cut_by_disconnect)
TEST_ENTRY(unread_replies_bounded)
TEST_ENTRY(descriptors_exhausted)
TEST_ENTRY(nothing_left_behind)
TEST_ENTRY(create_never_fits)
TEST_ENTRY(seal_after_delete)
TEST_ENTRY(untrusted_daemon_refused)
TEST_ENTRY(socket_refused_is_eacces)
TEST_LIST_END
