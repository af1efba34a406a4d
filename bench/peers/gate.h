/* The peer's side of a gate (bench/gate.h): with --gate DIR, each rank
 * opens DIR/go.<rank> and runs one batch for each 'r' read from it; any
 * other byte, or the end of the file, ends it. */
#ifndef MGPU_PEERS_GATE_H
#define MGPU_PEERS_GATE_H

#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

/* Opens rank's FIFO in dir (aborting the job, with prog named, when it
 * cannot). Read-write, so that the open does not wait for the writer. */
static int peer_gate_open(const char *prog, const char *dir, int rank) {
  char path[4096];
  snprintf(path, sizeof path, "%s/go.%d", dir, rank);
  int fd = open(path, O_RDWR);
  if (fd < 0) {
    fprintf(stderr, "%s: rank %d: cannot open %s\n", prog, rank, path);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return fd;
}

/* Waits for the next word on fd: 1 to run a batch, 0 to end. */
static int peer_gate_next(int fd) {
  char c;
  return read(fd, &c, 1) == 1 && c == 'r';
}

#endif
