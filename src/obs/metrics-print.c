/* mgpu_metrics_print: a snapshot as a table for people or one JSON object
 * for scripts. Both come from the same snapshot, so they always agree. */
#include <string.h>

#include "obs/obs.h"
#include "util/log.h"

static const char *const path_names[MGPU_METRIC_PATHS] = {
    "h2d", "d2h", "d2d", "peer_direct", "peer_staged"};

const char *mgpu_metric_path_name(int path) {
  return path >= 0 && path < MGPU_METRIC_PATHS ? path_names[path] : "?";
}

static void mib(FILE *f, const char *fmt, uint64_t bytes) {
  fprintf(f, fmt, (double)bytes / (1 << 20));
}

static void print_table(FILE *f, const mgpu_metrics *m) {
  fprintf(f, "mgpu metrics over %.3f s\n", m->wall_ns / 1e9);
  fprintf(f, "%-6s %6s %10s %10s %10s %10s %8s %8s %8s\n", "device", "util",
          "busy ms", "mem MiB", "cached MiB", "peak MiB", "kernels", "tasks",
          "stolen");
  for (int i = 0; i < m->ndevices; i++) {
    const mgpu_device_metrics *d = &m->dev[i];
    fprintf(f, "%-6d %5.1f%% %10.3f", i, 100 * d->utilization, d->busy_ns / 1e6);
    mib(f, " %10.2f", d->mem_in_use);
    mib(f, " %10.2f", d->mem_pool_cached);
    mib(f, " %10.2f", d->mem_peak);
    fprintf(f, " %8llu %8llu %8llu\n", (unsigned long long)d->kernels_launched,
            (unsigned long long)d->tasks_run,
            (unsigned long long)d->tasks_stolen);
  }
  int any = 0;
  for (int i = 0; i < m->ndevices; i++)
    for (int k = 0; k < MGPU_METRIC_PATHS; k++) any |= m->dev[i].copy_ns[k] != 0;
  if (any) {
    fprintf(f, "%-6s %-12s %12s %10s %10s\n", "device", "copy path", "MiB",
            "ms", "GB/s");
    for (int i = 0; i < m->ndevices; i++)
      for (int k = 0; k < MGPU_METRIC_PATHS; k++) {
        const mgpu_device_metrics *d = &m->dev[i];
        if (d->copy_ns[k] == 0) continue;
        fprintf(f, "%-6d %-12s", i, path_names[k]);
        mib(f, " %12.2f", d->copy_bytes[k]);
        fprintf(f, " %10.3f %10.2f\n", d->copy_ns[k] / 1e6, d->copy_gbps[k]);
      }
  }
  fprintf(f, "load imbalance %.3f (max busy / mean busy - 1)\n",
          m->load_imbalance);
}

static void print_json(FILE *f, const mgpu_metrics *m) {
  fprintf(f, "{\"wall_ns\": %llu, \"load_imbalance\": %.6f, \"devices\": [",
          (unsigned long long)m->wall_ns, m->load_imbalance);
  for (int i = 0; i < m->ndevices; i++) {
    const mgpu_device_metrics *d = &m->dev[i];
    fprintf(f, "%s\n  {\"device\": %d, \"utilization\": %.6f, "
            "\"mem_in_use\": %llu, \"mem_pool_cached\": %llu, "
            "\"mem_peak\": %llu", i ? "," : "", i, d->utilization,
            (unsigned long long)d->mem_in_use,
            (unsigned long long)d->mem_pool_cached,
            (unsigned long long)d->mem_peak);
#define MGPU__METRIC_JSON(name, doc) \
  fprintf(f, ", \"" #name "\": %llu", (unsigned long long)d->name);
    MGPU_METRICS_MAP(MGPU__METRIC_JSON)
#undef MGPU__METRIC_JSON
    fprintf(f, ", \"copies\": {");
    for (int k = 0; k < MGPU_METRIC_PATHS; k++)
      fprintf(f, "%s\"%s\": {\"ns\": %llu, \"bytes\": %llu, \"gbps\": %.6f}",
              k ? ", " : "", path_names[k], (unsigned long long)d->copy_ns[k],
              (unsigned long long)d->copy_bytes[k], d->copy_gbps[k]);
    fprintf(f, "}}");
  }
  fprintf(f, "\n]}\n");
}

int mgpu_metrics_print(FILE *out, mgpu_metrics_format format) {
  if (out == NULL)
    return mgpu__error(MGPU_EINVAL, "mgpu_metrics_print: out is NULL");
  if (format != MGPU_METRICS_TABLE && format != MGPU_METRICS_JSON)
    return mgpu__error(MGPU_EINVAL, "mgpu_metrics_print: format %d is "
                       "neither MGPU_METRICS_TABLE nor MGPU_METRICS_JSON",
                       (int)format);
  mgpu_metrics m = {.size = sizeof m};
  int rc = mgpu_metrics_snapshot(&m);
  if (rc != 0) return rc;
  if (format == MGPU_METRICS_TABLE)
    print_table(out, &m);
  else
    print_json(out, &m);
  if (fflush(out) != 0 || ferror(out))
    return mgpu__error(MGPU_EIO, "mgpu_metrics_print: writing failed");
  return 0;
}
