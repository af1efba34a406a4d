/* Loading of the backend plugins (libmgpu-cuda.so, libmgpu-opencl.so).
 *
 * libmgpu itself never links the CUDA runtime or the OpenCL loader, so that
 * one build runs on machines with no GPU and no driver. mgpu_init asks for a
 * plugin here; it is opened with dlopen from the first of these places that
 * holds it:
 *   1. every directory (or file) of MGPU_PLUGIN_PATH, colon-separated;
 *   2. the directory of the object that holds libmgpu (found with dladdr);
 *   3. the build tree's library directory (MGPU_BUILD_LIBDIR);
 *   4. the install library directory (MGPU_INSTALL_LIBDIR);
 *   5. the dynamic linker's own search path.
 * A file that is found but cannot be opened (a missing libcudart, say) stops
 * the search: its dlerror is the clearest explanation there is.
 *
 * A plugin exports one entry symbol named after the backend ABI it serves
 * (MGPU__PLUGIN_ENTRY, mgpu_backend_plugin_v<ABI>); the loader looks up
 * exactly that name. A plugin of another ABI lacks it: the loader then
 * looks for the entry of the ABIs before and after this one to name what
 * the plugin serves, refuses it with one log line and closes it again; so
 * it does with a plugin whose entry fails or returns a backend of another
 * kind. A plugin that loaded stays open for the life of the process: the
 * unload functions close nothing (the vendor runtimes keep threads and
 * exit handlers inside it), and the next mgpu_init calls its entry again
 * with that init's environment. Each plugin is described by one struct
 * plugin below; the search and the checks are shared.
 *
 * Threading: called by mgpu_init and mgpu_shutdown only, which the core
 * serializes; the static state below needs no lock of its own.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "mgpu/error.h"

/* The integer that plugins of backend ABI 6 and before exported beside
 * their entry (mgpu_backend_plugin_v1), read only to name their ABI. */
#define LEGACY_ABI_SYMBOL "mgpu_backend_plugin_abi"
/* How far past this ABI the loader looks for a newer plugin's entry. */
#define NEWER_ABIS 16

#ifndef MGPU_BUILD_LIBDIR
#define MGPU_BUILD_LIBDIR ""
#endif
#ifndef MGPU_INSTALL_LIBDIR
#define MGPU_INSTALL_LIBDIR ""
#endif

/* One plugin: its file, its name in messages, the backend kind it must
 * return, and its handle once opened. */
typedef struct plugin {
  const char *file;
  const char *label; /* "cuda" in log lines */
  const char *title; /* "CUDA" in details */
  const char *hint;  /* how to get it built */
  mgpu_backend_kind kind;
  void *handle;
} plugin;

/* Owned by init/shutdown (serialized by the core). penv is the environment
 * of the load in progress: its logger, error setter and configuration. */
static plugin cuda_plugin = {"libmgpu-cuda.so", "cuda", "CUDA",
                             "build with the CUDA toolkit",
                             MGPU_BACKEND_CUDA, NULL};
static plugin opencl_plugin = {"libmgpu-opencl.so", "opencl", "OpenCL",
                               "build with the OpenCL headers and ICD loader",
                               MGPU_BACKEND_OPENCL, NULL};
static const mgpu__backend_env *penv;

/* Why the search failed, for the detail: the first dlerror of a file that
 * exists, else the list of places searched. */
typedef struct search_state {
  char searched[1024];
  char failure[512];
  int found_broken; /* a file existed but dlopen refused it */
} search_state;

static void note_searched(search_state *st, const char *what) {
  size_t len = strlen(st->searched);
  snprintf(st->searched + len, sizeof st->searched - len, "%s%s",
           len ? ", " : "", what);
}

/* Tries one path: a directory (the plugin's file is appended) or a file
 * (taken only when it is that plugin's file, so that one MGPU_PLUGIN_PATH
 * can name both plugins). Returns the handle, or NULL when absent or broken
 * (st notes which). */
static void *try_path(const plugin *pl, search_state *st, const char *where) {
  char path[1024];
  if (where == NULL || where[0] == '\0') return NULL;
  size_t n = strlen(where);
  if (n >= 3 && strcmp(where + n - 3, ".so") == 0) {
    const char *base = strrchr(where, '/');
    base = base ? base + 1 : where;
    /* A file named in the path: the CUDA plugin keeps taking any .so, as
     * it always did; the OpenCL plugin only its own file. */
    if (pl->kind != MGPU_BACKEND_CUDA && strcmp(base, pl->file) != 0)
      return NULL;
    snprintf(path, sizeof path, "%s", where);
  } else {
    snprintf(path, sizeof path, "%s/%s", where, pl->file);
  }
  note_searched(st, where);
  if (access(path, R_OK) != 0) return NULL;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL && !st->found_broken) {
    const char *e = dlerror();
    snprintf(st->failure, sizeof st->failure, "%.500s", e ? e : path);
    st->found_broken = 1;
  }
  if (h != NULL) penv->log(MGPU_LOG_DEBUG, "%s: opened plugin %s", pl->label,
                           path);
  return h;
}

static void *search_plugin(const plugin *pl, search_state *st) {
  void *h = NULL;
  const char *env = penv->config->plugin_path;
  if (env != NULL && env[0] != '\0') {
    char list[2048];
    snprintf(list, sizeof list, "%s", env);
    char *save = NULL;
    for (char *dir = strtok_r(list, ":", &save); dir && !h && !st->found_broken;
         dir = strtok_r(NULL, ":", &save))
      h = try_path(pl, st, dir);
  }

  /* The directory of the object holding this code: libmgpu.so, or the
   * executable when libmgpu is linked statically. */
  Dl_info info;
  if (!h && !st->found_broken &&
      dladdr((void *)&search_plugin, &info) != 0 &&
      info.dli_fname != NULL) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", info.dli_fname);
    char *slash = strrchr(dir, '/');
    if (slash != NULL) {
      *slash = '\0';
      h = try_path(pl, st, dir);
    }
  }
  if (!h && !st->found_broken) h = try_path(pl, st, MGPU_BUILD_LIBDIR);
  if (!h && !st->found_broken) h = try_path(pl, st, MGPU_INSTALL_LIBDIR);
  if (!h && !st->found_broken) {
    note_searched(st, "the default library path");
    h = dlopen(pl->file, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
      const char *e = dlerror();
      /* "cannot open shared object file" only means it is not there. */
      if (e != NULL && strstr(e, "cannot open shared object file") == NULL) {
        snprintf(st->failure, sizeof st->failure, "%s", e);
        st->found_broken = 1;
      }
    }
  }
  return h;
}

/* Sets the error of a plugin that search_plugin did not open: found but
 * refused by the loader, or not found where st says it looked. */
static void report_unopened(const plugin *pl, const search_state *st) {
  if (st->found_broken) {
    penv->log(MGPU_LOG_INFO, "%s: plugin refused: %s", pl->label,
              st->failure);
    penv->set_error(MGPU_EPLUGIN, "the %s backend plugin %s could not be "
                    "opened: %s", pl->title, pl->file, st->failure);
  } else {
    penv->log(MGPU_LOG_INFO, "%s: plugin %s not found (searched %s)",
              pl->label, pl->file, st->searched);
    penv->set_error(MGPU_EPLUGIN, "the %s backend plugin %s was not found "
                    "(searched %s; set MGPU_PLUGIN_PATH, or %s)", pl->title,
                    pl->file, st->searched, pl->hint);
  }
}

/* The name of the entry of another backend ABI that h exports, in name
 * (and that ABI in *abi), or 0 when h exports none. */
static int other_entry(void *h, char *name, size_t name_size, int *abi) {
  for (int v = 1; v <= MGPU__BACKEND_ABI + NEWER_ABIS; v++) {
    if (v == MGPU__BACKEND_ABI) continue;
    snprintf(name, name_size, MGPU__PLUGIN_ENTRY_PREFIX "%d", v);
    if (dlsym(h, name) == NULL) continue;
    *abi = v;
    /* Before ABI 7 every ABI's entry was mgpu_backend_plugin_v1, with the
     * ABI in an integer beside it. */
    const int *legacy = v == 1 ? (const int *)dlsym(h, LEGACY_ABI_SYMBOL)
                               : NULL;
    if (legacy != NULL) *abi = *legacy;
    return 1;
  }
  return 0;
}

/* Finds the entry of opened plugin h, the one named after this backend ABI;
 * -1 with the error set when it lacks it, naming what it exports instead. */
static int plugin_entry(const plugin *pl, void *h,
                        mgpu__plugin_entry_fn *entry) {
  /* dlsym returns an object pointer; POSIX guarantees it converts. */
  *(void **)entry = dlsym(h, MGPU__PLUGIN_ENTRY);
  if (*entry != NULL) return 0;
  char other[64];
  int abi = 0;
  if (other_entry(h, other, sizeof other, &abi)) {
    penv->log(MGPU_LOG_WARN, "%s: plugin refused: %s exports %s (backend "
              "ABI %d), libmgpu looks up %s (backend ABI %d)", pl->label,
              pl->file, other, abi, MGPU__PLUGIN_ENTRY, MGPU__BACKEND_ABI);
    penv->set_error(MGPU_EPLUGIN, "the %s backend plugin %s exports %s "
                    "(backend ABI %d), this libmgpu needs %s (backend ABI "
                    "%d): install matching versions", pl->title, pl->file,
                    other, abi, MGPU__PLUGIN_ENTRY, MGPU__BACKEND_ABI);
    return -1;
  }
  penv->log(MGPU_LOG_WARN, "%s: plugin refused: %s lacks the entry symbol "
            "%s", pl->label, pl->file, MGPU__PLUGIN_ENTRY);
  penv->set_error(MGPU_EPLUGIN, "the %s backend plugin %s lacks the entry "
                  "symbol %s (built for another mgpu version?)", pl->title,
                  pl->file, MGPU__PLUGIN_ENTRY);
  return -1;
}

static const mgpu__backend_ops *plugin_load(plugin *pl,
                                            const mgpu__backend_env *env) {
  search_state st;
  memset(&st, 0, sizeof st);
  penv = env;
  /* A plugin opened by an earlier mgpu_init stays open (see unload); its
   * entry is called again so that it takes this init's environment. */
  void *h = pl->handle != NULL ? pl->handle : search_plugin(pl, &st);
  if (h == NULL) {
    report_unopened(pl, &st);
    return NULL;
  }

  mgpu__plugin_entry_fn entry;
  if (plugin_entry(pl, h, &entry) != 0) {
    dlclose(h);
    return NULL;
  }

  /* The entry sets the error detail through env->set_error on failure. */
  const mgpu__backend_ops *ops = entry(env);
  if (ops == NULL || ops->kind != pl->kind) {
    if (ops != NULL)
      penv->set_error(MGPU_EPLUGIN, "the %s backend plugin %s returned a "
                      "backend of another kind (%s)", pl->title, pl->file,
                      ops->name);
    penv->log(MGPU_LOG_WARN, "%s: plugin refused: %s", pl->label,
              mgpu_error_detail());
    if (h != pl->handle) dlclose(h);
    return NULL;
  }
  pl->handle = h;
  return ops;
}

const mgpu__backend_ops *mgpu__cuda_backend_load(const mgpu__backend_env *env) {
  return plugin_load(&cuda_plugin, env);
}

void mgpu__cuda_backend_unload(void) {
  /* The CUDA runtime registers exit handlers and threads of its own;
   * closing libcudart under them is not safe, so the handle is kept open
   * for the life of the process and reused by the next mgpu_init. The
   * plugin's own state was torn down by the devices' close calls. */
}

const mgpu__backend_ops *mgpu__opencl_backend_load(
    const mgpu__backend_env *env) {
  return plugin_load(&opencl_plugin, env);
}

void mgpu__opencl_backend_unload(void) {
  /* OpenCL implementations (PoCL among them) start threads of their own
   * and keep them until the process ends: the loader is not closed under
   * them. The plugin keeps its contexts for the next mgpu_init. */
}
