/* A gated MPI peer: a baseline program started once under mpirun (or
 * mpiexec.mpich) whose ranks sleep in a read of a FIFO each until told to
 * run one batch, so that a benchmark runs mgpu's batches and the peer's in
 * turn, in the same seconds (the speed of a shared machine drifts by a
 * third within a minute). The peer's side is bench/peers/gate.h.
 *
 * The protocol: the benchmark makes DIR with one FIFO go.<rank> a rank and
 * starts the peer with --gate DIR; rank 0 prints "ready ..." once every
 * rank has its FIFO open; then each 'r' written to every FIFO runs one
 * batch, after which rank 0 prints one line of figures; 'q' (or the FIFOs
 * closed) ends the peer. */
#ifndef MGPU_BENCH_GATE_H
#define MGPU_BENCH_GATE_H

#include <stddef.h>
#include <stdio.h>

#include "../tools/cmd.h"
#include "mgpu/core.h"

typedef struct bench_gate {
  FILE *out; /* the peer's output (mgpu_cmd_mpirun) */
  int fd[MGPU_MAX_DEVICES], nfd, ranks;
  char dir[64];
} bench_gate;

/* Starts MPI m's peer prog (a name mgpu_cmd_mpi_peer finds) on ranks
 * ranks with args, after "--gate DIR", under a timeout of timeout_s
 * seconds, and waits until it is ready: 0 with what followed "ready" on
 * its line in ready (ready_len bytes), else -1 with why filled in and
 * nothing left running or on disk. */
int bench_gate_start(mgpu_cmd_mpi m, const char *prog, int ranks,
                     int timeout_s, const char *args, bench_gate *g,
                     char *ready, size_t ready_len, char *why, size_t wlen);

/* Runs one batch of g's peer: 0 with rank 0's line of figures in line
 * (len bytes), -1 when the peer is gone. */
int bench_gate_batch(bench_gate *g, char *line, size_t len);

/* Ends g's peer: 0 when it exited well after printing what the caller
 * wanted (figures: whether the caller read its figures), else -1 with why
 * filled in (mgpu_cmd_mpi_close). Removes the FIFOs and DIR. */
int bench_gate_end(bench_gate *g, int figures, char *why, size_t wlen);

#endif
