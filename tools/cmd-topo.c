/* mgpu topo: the link matrix of the open devices.
 *
 *   mgpu topo [--json] [--measure [SIZE]]
 *
 * Prints each device with its NUMA node, then for every ordered pair the
 * link kind (what the hardware offers) and the path a copy takes now; with
 * --measure, also the bandwidth of a SIZE copy (default 16M) and the latency
 * of a 1-byte copy along that path. --json prints one JSON object with the
 * same facts (measured figures are null until measured). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"

static const char usage_text[] =
    "usage: mgpu topo [--json] [--measure [SIZE]]\n"
    "  --json            print the matrix as one JSON object\n"
    "  --measure [SIZE]  measure bandwidth (SIZE bytes, e.g. 16M; default "
    "16M)\n                    and latency of every ordered pair\n";

/* "16M", "512K", "1G", "4096" -> bytes; 0 on a bad value. */
/* "4096", "16M", "1GiB"; 0 for anything else, and for a size whose bytes
 * do not fit (17592186044417M wrapped to 1 MiB) or exceed what
 * mgpu_topology_measure takes. */
static size_t parse_size(const char *s) {
  char *end;
  if (*s < '0' || *s > '9') return 0;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s || errno != 0) return 0;
  unsigned shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
  }
  if (*end == 'i' && end[1] == 'B') end += 2;
  if (*end != '\0' || v > (MGPU_TOPO_MEASURE_MAX >> shift)) return 0;
  return (size_t)(v << shift);
}

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') putchar('\\');
    if ((unsigned char)*s < 0x20) continue;
    putchar(*s);
  }
  putchar('"');
}

static void print_json(const mgpu_topo *t) {
  mgpu_device_props p = {.size = sizeof p};
  printf("{\"devices\": %d, \"numa_nodes\": %d, \"measured\": %s,\n",
         t->ndevices, t->numa_nodes, t->measured ? "true" : "false");
  printf(" \"device\": [");
  for (int i = 0; i < t->ndevices; i++) {
    p.size = sizeof p;
    if (mgpu_device_get_props(i, &p) != 0) memset(p.name, 0, sizeof p.name);
    printf("%s\n   {\"id\": %d, \"name\": ", i ? "," : "", i);
    json_str(p.name);
    printf(", \"backend\": ");
    json_str(p.backend);
    printf(", \"pci_bus_id\": ");
    json_str(p.pci_bus_id);
    printf(", \"numa_node\": %d}", t->numa_node[i]);
  }
  printf("],\n \"links\": [");
  for (int a = 0; a < t->ndevices; a++)
    for (int b = 0; b < t->ndevices; b++) {
      const mgpu_link *l = MGPU_TOPO_LINK(t, a, b);
      printf("%s\n   {\"src\": %d, \"dst\": %d, \"kind\": \"%s\", "
             "\"path\": \"%s\"", a || b ? "," : "", a, b,
             mgpu_link_kind_name(l->kind), mgpu_copy_path_name(l->path));
      if (t->measured)
        printf(", \"bandwidth_gbps\": %.4g, \"latency_us\": %.4g}",
               l->bandwidth_gbps, l->latency_us);
      else
        printf(", \"bandwidth_gbps\": null, \"latency_us\": null}");
    }
  printf("]}\n");
}

/* One matrix: rows are sources, columns destinations. cell prints one
 * entry into buf. */
static void print_matrix(const mgpu_topo *t, const char *title,
                         void (*cell)(const mgpu_link *l, char *buf, size_t n)) {
  char buf[32];
  printf("\n%s (row: from, column: to)\n%6s", title, "");
  for (int b = 0; b < t->ndevices; b++) printf(" %12d", b);
  printf("\n");
  for (int a = 0; a < t->ndevices; a++) {
    printf("%6d", a);
    for (int b = 0; b < t->ndevices; b++) {
      cell(MGPU_TOPO_LINK(t, a, b), buf, sizeof buf);
      printf(" %12s", buf);
    }
    printf("\n");
  }
}

static void cell_kind(const mgpu_link *l, char *buf, size_t n) {
  snprintf(buf, n, "%s", mgpu_link_kind_name(l->kind));
}
static void cell_path(const mgpu_link *l, char *buf, size_t n) {
  snprintf(buf, n, "%s", mgpu_copy_path_name(l->path));
}
static void cell_bw(const mgpu_link *l, char *buf, size_t n) {
  snprintf(buf, n, "%.2f", l->bandwidth_gbps);
}
static void cell_lat(const mgpu_link *l, char *buf, size_t n) {
  snprintf(buf, n, "%.1f", l->latency_us);
}

static void print_table(const mgpu_topo *t, size_t measured_size) {
  printf("%d devices, %d NUMA node%s\n", t->ndevices, t->numa_nodes,
         t->numa_nodes == 1 ? "" : "s");
  printf("%6s %5s  %-14s %s\n", "device", "numa", "pci bus id", "name");
  for (int i = 0; i < t->ndevices; i++) {
    mgpu_device_props p = {.size = sizeof p};
    if (mgpu_device_get_props(i, &p) != 0) continue;
    printf("%6d %5d  %-14s %s\n", i, t->numa_node[i],
           p.pci_bus_id[0] ? p.pci_bus_id : "-", p.name);
  }
  print_matrix(t, "link kind", cell_kind);
  print_matrix(t, "copy path now", cell_path);
  if (t->measured) {
    char title[64];
    snprintf(title, sizeof title, "bandwidth GB/s, %zu-byte copies",
             measured_size);
    print_matrix(t, title, cell_bw);
    print_matrix(t, "latency us, 1-byte copies", cell_lat);
  } else {
    printf("\n(bandwidth and latency: mgpu topo --measure)\n");
  }
}

int mgpu_cmd_topo(int argc, char **argv) {
  int json = 0, measure = 0;
  size_t size = (size_t)16 << 20;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) {
      json = 1;
    } else if (strcmp(argv[i], "--measure") == 0) {
      measure = 1;
      if (i + 1 < argc && argv[i + 1][0] != '-') {
        size = parse_size(argv[++i]);
        if (size == 0) {
          fprintf(stderr, "mgpu topo: bad size '%s'\n%s", argv[i], usage_text);
          return 2;
        }
      }
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      fputs(usage_text, stdout);
      return 0;
    } else {
      fprintf(stderr, "mgpu topo: unknown argument '%s'\n%s", argv[i],
              usage_text);
      return 2;
    }
  }
  int rc = mgpu_cmd_init();
  if (rc != 0) return rc;
  if (measure && (rc = mgpu_topology_measure(size)) != 0)
    return mgpu_cmd_fail("topology measurement", rc);
  mgpu_topo *t;
  if ((rc = mgpu_topology(&t)) != 0) return mgpu_cmd_fail("topology", rc);
  if (json)
    print_json(t);
  else
    print_table(t, size);
  mgpu_topology_free(t);
  return 0;
}
