/* A gated MPI peer (gate.h). */
#include "gate.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Sends c to every rank of g: 0, or -1 when one is gone. */
static int gate_send(bench_gate *g, char c) {
  int rc = 0;
  for (int r = 0; r < g->nfd; r++)
    if (write(g->fd[r], &c, 1) != 1) rc = -1;
  return rc;
}

/* Removes g's FIFOs and their folder. */
static void gate_unlink(bench_gate *g) {
  char path[96];
  for (int r = 0; r < g->ranks; r++) {
    snprintf(path, sizeof path, "%s/go.%d", g->dir, r);
    unlink(path);
  }
  rmdir(g->dir);
}

int bench_gate_end(bench_gate *g, int figures, char *why, size_t wlen) {
  gate_send(g, 'q');
  for (int r = 0; r < g->nfd; r++) close(g->fd[r]);
  int rc = mgpu_cmd_mpi_close(g->out, figures, why, wlen);
  gate_unlink(g);
  return rc;
}

/* Makes g's folder and one FIFO a rank: 0, or -1 with why filled in and
 * nothing left on disk. */
static int gate_fifos(bench_gate *g, const char *prog, int ranks, char *why,
                      size_t wlen) {
  char path[96];
  snprintf(g->dir, sizeof g->dir, "/tmp/mgpu-%.20s-XXXXXX", prog);
  if (mkdtemp(g->dir) == NULL) {
    snprintf(why, wlen, "cannot make a folder for its FIFOs");
    return -1;
  }
  for (; g->ranks < ranks; g->ranks++) {
    snprintf(path, sizeof path, "%s/go.%d", g->dir, g->ranks);
    if (mkfifo(path, 0600) != 0) {
      snprintf(why, wlen, "cannot make the FIFO %s for rank %d: %s", path,
               g->ranks, strerror(errno));
      gate_unlink(g);
      return -1;
    }
  }
  return 0;
}

int bench_gate_start(mgpu_cmd_mpi m, const char *prog, int ranks,
                     int timeout_s, const char *args, bench_gate *g,
                     char *ready, size_t ready_len, char *why, size_t wlen) {
  char peer[PATH_MAX], path[96], all[512], line[256];
  memset(g, 0, sizeof *g);
  if (ranks < 1 || ranks > MGPU_MAX_DEVICES) {
    snprintf(why, wlen, "%d ranks (1 to %d)", ranks, MGPU_MAX_DEVICES);
    return -1;
  }
  if (!mgpu_cmd_mpi_peer(m, prog, ranks, peer, sizeof peer, why, wlen) ||
      gate_fifos(g, prog, ranks, why, wlen) != 0)
    return -1;
  snprintf(all, sizeof all, "--gate %s %s", g->dir, args);
  /* A rank that hangs (its line never comes) holds the benchmark until
   * this timeout ends it. */
  g->out = mgpu_cmd_mpirun(m, ranks, timeout_s, peer, all);
  if (g->out == NULL) {
    snprintf(why, wlen, "cannot start its launcher");
    gate_unlink(g);
    return -1;
  }
  /* "ready" comes once every rank has its FIFO open: each open below
   * finds a reader, unless the peer is not the one expected or died. */
  int ok = fgets(line, sizeof line, g->out) != NULL &&
           strncmp(line, "ready", 5) == 0;
  if (ok) {
    line[strcspn(line, "\n")] = '\0';
    snprintf(ready, ready_len, "%s", line + 5);
  }
  while (ok && g->nfd < ranks) {
    snprintf(path, sizeof path, "%s/go.%d", g->dir, g->nfd);
    int fd = open(path, O_WRONLY | O_NONBLOCK);
    ok = fd >= 0;
    if (ok) g->fd[g->nfd++] = fd;
  }
  if (ok) return 0;
  bench_gate_end(g, 0, why, wlen);
  return -1;
}

int bench_gate_batch(bench_gate *g, char *line, size_t len) {
  if (gate_send(g, 'r') != 0 || fgets(line, (int)len, g->out) == NULL)
    return -1;
  return 0;
}
