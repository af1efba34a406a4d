/* The daemon's command line (tools/store-serve.h). */
#include "store-serve.h"

#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mgpu.h"
#include "mgpu/module.h"
#include "mgpu/store.h"

static int usage(const char *cmd) {
  fprintf(stderr, "usage: %s [--socket PATH] [--capacity SIZE] "
                  "[--allow-group GROUP]\n", cmd);
  return 2;
}

int mgpu_store_serve_main(int argc, char **argv) {
  mgpu_store_server_config cfg = MGPU_STORE_SERVER_CONFIG_INITIALIZER;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc) {
      cfg.path = argv[++i];
    } else if (strcmp(argv[i], "--capacity") == 0 && i + 1 < argc) {
      /* Read as MGPU_STORE_CAPACITY is (512M, 2G, 1T). */
      const char *v = argv[++i];
      if (mgpu_module_parse_size(v, &cfg.capacity) != 0 || cfg.capacity == 0) {
        fprintf(stderr, "%s: --capacity %s: expected a size of at least one "
                "byte (512M, 2G, 1T)\n", argv[0], v);
        return 2;
      }
    } else if (strcmp(argv[i], "--allow-group") == 0 && i + 1 < argc) {
      const char *g = argv[++i];
      struct group *gr = getgrnam(g);
      char *end;
      long gid = strtol(g, &end, 10);
      if (gr != NULL) gid = (long)gr->gr_gid;
      else if (*end != '\0' || gid < 0) {
        fprintf(stderr, "%s: no group '%s'\n", argv[0], g);
        return 2;
      }
      cfg.allow_gid = gid;
    } else {
      fprintf(stderr, "%s: unknown option or missing value: %s\n", argv[0],
              argv[i]);
      return usage(argv[0]);
    }
  }
  /* A daemon says what it does: connections and refusals are logged unless
   * MGPU_LOG asks for something else. */
  mgpu_config mc = MGPU_CONFIG_INITIALIZER;
  if (mgpu_module_getenv("MGPU_LOG") == NULL) mc.log_level = MGPU_LOG_INFO;
  int rc = mgpu_init(&mc);
  if (rc == 0) rc = mgpu_store_serve(&cfg);
  if (rc != 0)
    fprintf(stderr, "%s: %s (%s): %s\n", argv[0], mgpu_err_name(rc),
            mgpu_strerror(rc), mgpu_error_detail());
  mgpu_shutdown();
  return rc == 0 ? 0 : 1;
}
