/* mgpu devices [--json]: the open devices and their properties. */
#include <string.h>

#include "cmd.h"

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') putchar('\\');
    putchar(*s);
  }
  putchar('"');
}

int mgpu_cmd_devices(int argc, char **argv) {
  int json = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) {
      json = 1;
    } else {
      fprintf(stderr, "usage: mgpu devices [--json]\n");
      return 2;
    }
  }
  int rc = mgpu_cmd_init();
  if (rc != 0) return rc;
  int n = mgpu_device_count();
  if (json) printf("[");
  else
    printf("%-3s %-34s %-7s %10s %10s %-5s %-4s %-5s %s\n", "id", "name",
           "backend", "total MiB", "free MiB", "cc", "SMs", "numa", "peer");
  for (int i = 0; i < n; i++) {
    mgpu_device_props p = {.size = sizeof p};
    rc = mgpu_device_get_props(i, &p);
    if (rc != 0) return mgpu_cmd_fail("device properties", rc);
    if (json) {
      printf("%s\n {\"id\": %d, \"name\": ", i ? "," : "", i);
      json_str(p.name);
      printf(", \"backend\": ");
      json_str(p.backend);
      printf(", \"total_mem\": %zu, \"free_mem\": %zu, \"cc\": \"%d.%d\", "
             "\"multiprocessors\": %d, \"numa_node\": %d, \"peer_capable\": "
             "%s, \"ordinal\": %d, \"split\": [%d, %d], \"pci_bus_id\": ",
             p.total_mem, p.free_mem, p.cc_major, p.cc_minor,
             p.multiprocessors, p.numa_node, p.peer_capable ? "true" : "false",
             p.ordinal, p.split_index, p.split_count);
      json_str(p.pci_bus_id);
      printf(", \"uuid\": ");
      json_str(p.uuid);
      printf("}");
    } else {
      printf("%-3d %-34s %-7s %10zu %10zu %d.%-3d %-4d %-5d %s\n", i, p.name,
             p.backend, p.total_mem >> 20, p.free_mem >> 20, p.cc_major,
             p.cc_minor, p.multiprocessors, p.numa_node,
             p.peer_capable ? "yes" : "no");
    }
  }
  if (json) printf("\n]\n");
  return 0;
}
