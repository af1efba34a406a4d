/* The mgpu command: dispatches to one file per subcommand. */
#include <string.h>

#include "cmd.h"

typedef struct command {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *help;
} command;

static const command commands[] = {
    {"version", mgpu_cmd_version, "print the library version"},
    {"devices", mgpu_cmd_devices, "list devices (--json)"},
    {"topo", mgpu_cmd_topo, "print the link matrix of the devices (--json)"},
    {"bench", mgpu_cmd_bench, "run a benchmark: mgpu bench NAME [--json]"},
    {"demo", mgpu_cmd_demo, "run a demo: mgpu demo NAME"},
    {"trace", mgpu_cmd_trace, "draw a trace: mgpu trace view T.json -o T.png"},
    {"store", mgpu_cmd_store,
     "share buffers between processes: serve|ls|put|get|rm|stat"},
};

static int usage(FILE *out) {
  fprintf(out, "usage: mgpu COMMAND [ARGS]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].help);
  fprintf(out, "\nenvironment: MGPU_DEVICES (host:4, cuda, cuda:1, cuda:0/4,"
               " opencl, opencl:0/2), MGPU_HOST_MEM, MGPU_LOG\n");
  return 2;
}

int mgpu_cmd_fail(const char *what, int rc) {
  fprintf(stderr, "mgpu: %s: %s (%s)", what, mgpu_err_name(rc),
          mgpu_strerror(rc));
  if (mgpu_error_detail()[0] != '\0')
    fprintf(stderr, ": %s", mgpu_error_detail());
  fprintf(stderr, "\n");
  return 1;
}

int mgpu_cmd_init(void) {
  int rc = mgpu_init(NULL);
  return rc == 0 ? 0 : mgpu_cmd_fail("init", rc);
}

int main(int argc, char **argv) {
  if (argc < 2) return usage(stderr);
  if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
      strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    if (strcmp(argv[1], commands[i].name) == 0) {
      int rc = commands[i].fn(argc - 1, argv + 1);
      mgpu_shutdown();
      return rc;
    }
  }
  fprintf(stderr, "mgpu: unknown command '%s'\n", argv[1]);
  return usage(stderr);
}
