/* Loading of the CUDA backend plugin (libmgpu-cuda.so).
 *
 * libmgpu itself never links the CUDA runtime, so that one build runs on
 * machines with no GPU and no driver. mgpu_init asks for the plugin here; the
 * plugin is opened with dlopen from the first of these places that holds it:
 *   1. every directory (or file) of MGPU_PLUGIN_PATH, colon-separated;
 *   2. the directory of the object that holds libmgpu (found with dladdr);
 *   3. the build tree's library directory (MGPU_BUILD_LIBDIR);
 *   4. the install library directory (MGPU_INSTALL_LIBDIR);
 *   5. the dynamic linker's own search path.
 * A file that is found but cannot be opened (a missing libcudart, say) stops
 * the search: its dlerror is the clearest explanation there is.
 *
 * The plugin exports one versioned entry symbol (MGPU__PLUGIN_ENTRY) and the
 * integer mgpu_backend_plugin_abi. A plugin whose ABI differs is refused with
 * one log line and closed again. The handle stays open until
 * mgpu__cuda_backend_unload (called by mgpu_shutdown).
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

#define PLUGIN_FILE "libmgpu-cuda.so"
#define PLUGIN_ABI_SYMBOL "mgpu_backend_plugin_abi"

#ifndef MGPU_BUILD_LIBDIR
#define MGPU_BUILD_LIBDIR ""
#endif
#ifndef MGPU_INSTALL_LIBDIR
#define MGPU_INSTALL_LIBDIR ""
#endif

/* Owned by init/shutdown (serialized by the core). penv is the environment
 * of the load in progress: its logger, error setter and configuration. */
static void *plugin_handle;
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

/* Tries one path: a directory (PLUGIN_FILE is appended) or a file. Returns
 * the handle, or NULL when absent or broken (st notes which). */
static void *try_path(search_state *st, const char *where) {
  char path[1024];
  if (where == NULL || where[0] == '\0') return NULL;
  size_t n = strlen(where);
  if (n >= 3 && strcmp(where + n - 3, ".so") == 0)
    snprintf(path, sizeof path, "%s", where);
  else
    snprintf(path, sizeof path, "%s/%s", where, PLUGIN_FILE);
  note_searched(st, where);
  if (access(path, R_OK) != 0) return NULL;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL && !st->found_broken) {
    const char *e = dlerror();
    snprintf(st->failure, sizeof st->failure, "%.500s", e ? e : path);
    st->found_broken = 1;
  }
  if (h != NULL) penv->log(MGPU_LOG_DEBUG, "cuda: opened plugin %s", path);
  return h;
}

static void *search_plugin(search_state *st) {
  void *h = NULL;
  const char *env = penv->config->plugin_path;
  if (env != NULL && env[0] != '\0') {
    char list[2048];
    snprintf(list, sizeof list, "%s", env);
    char *save = NULL;
    for (char *dir = strtok_r(list, ":", &save); dir && !h && !st->found_broken;
         dir = strtok_r(NULL, ":", &save))
      h = try_path(st, dir);
  }

  /* The directory of the object holding this code: libmgpu.so, or the
   * executable when libmgpu is linked statically. */
  Dl_info info;
  if (!h && !st->found_broken &&
      dladdr((void *)&mgpu__cuda_backend_load, &info) != 0 &&
      info.dli_fname != NULL) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", info.dli_fname);
    char *slash = strrchr(dir, '/');
    if (slash != NULL) {
      *slash = '\0';
      h = try_path(st, dir);
    }
  }
  if (!h && !st->found_broken) h = try_path(st, MGPU_BUILD_LIBDIR);
  if (!h && !st->found_broken) h = try_path(st, MGPU_INSTALL_LIBDIR);
  if (!h && !st->found_broken) {
    note_searched(st, "the default library path");
    h = dlopen(PLUGIN_FILE, RTLD_NOW | RTLD_LOCAL);
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

const mgpu__backend_ops *mgpu__cuda_backend_load(const mgpu__backend_env *env) {
  search_state st;
  memset(&st, 0, sizeof st);
  penv = env;
  /* A plugin opened by an earlier mgpu_init stays open (see unload); its
   * entry is called again so that it takes this init's environment. */
  void *h = plugin_handle != NULL ? plugin_handle : search_plugin(&st);
  if (h == NULL) {
    if (st.found_broken) {
      penv->log(MGPU_LOG_INFO, "cuda: plugin refused: %s", st.failure);
      penv->set_error(MGPU_EPLUGIN, "the CUDA backend plugin %s could not be "
                  "opened: %s", PLUGIN_FILE, st.failure);
    } else {
      penv->log(MGPU_LOG_INFO, "cuda: plugin %s not found (searched %s)",
                PLUGIN_FILE, st.searched);
      penv->set_error(MGPU_EPLUGIN, "the CUDA backend plugin %s was not found "
                  "(searched %s; set MGPU_PLUGIN_PATH, or build with the "
                  "CUDA toolkit)", PLUGIN_FILE, st.searched);
    }
    return NULL;
  }

  const int *abi = (const int *)dlsym(h, PLUGIN_ABI_SYMBOL);
  mgpu__plugin_entry_fn entry;
  /* dlsym returns an object pointer; POSIX guarantees it converts. */
  *(void **)&entry = dlsym(h, MGPU__PLUGIN_ENTRY);
  if (abi == NULL || entry == NULL) {
    penv->log(MGPU_LOG_WARN, "cuda: plugin refused: %s lacks the entry "
              "symbol %s", PLUGIN_FILE, MGPU__PLUGIN_ENTRY);
    penv->set_error(MGPU_EPLUGIN, "the CUDA backend plugin %s lacks the entry "
                "symbol %s (built for another mgpu version?)", PLUGIN_FILE,
                MGPU__PLUGIN_ENTRY);
    dlclose(h);
    return NULL;
  }
  if (*abi != MGPU__BACKEND_ABI) {
    penv->log(MGPU_LOG_WARN, "cuda: plugin refused: %s has backend ABI %d, "
              "libmgpu has %d", PLUGIN_FILE, *abi, MGPU__BACKEND_ABI);
    penv->set_error(MGPU_EPLUGIN, "the CUDA backend plugin %s has backend ABI %d, "
                "this libmgpu needs %d: install matching versions",
                PLUGIN_FILE, *abi, MGPU__BACKEND_ABI);
    dlclose(h);
    return NULL;
  }

  /* The entry sets the error detail through env->set_error on failure. */
  const mgpu__backend_ops *ops = entry(env);
  if (ops == NULL || ops->kind != MGPU_BACKEND_CUDA) {
    if (ops != NULL)
      penv->set_error(MGPU_EPLUGIN, "the CUDA backend plugin %s returned a "
                  "backend of another kind (%s)", PLUGIN_FILE, ops->name);
    penv->log(MGPU_LOG_WARN, "cuda: plugin refused: %s", mgpu_error_detail());
    if (h != plugin_handle) dlclose(h);
    return NULL;
  }
  plugin_handle = h;
  return ops;
}

void mgpu__cuda_backend_unload(void) {
  /* The CUDA runtime registers exit handlers and threads of its own;
   * closing libcudart under them is not safe, so the handle is kept open
   * for the life of the process and reused by the next mgpu_init. The
   * plugin's own state was torn down by the devices' close calls. */
}
