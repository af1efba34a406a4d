/* The subcommands of the mgpu command, one file each (tools/cmd-<name>.c).
 * Each returns the process exit status: 0 success, 1 runtime failure (the
 * error and its detail printed), 2 bad arguments (usage printed). */
#ifndef MGPU_TOOLS_CMD_H
#define MGPU_TOOLS_CMD_H

#include <stdio.h>

#include "mgpu.h"

int mgpu_cmd_version(int argc, char **argv);
int mgpu_cmd_devices(int argc, char **argv);
int mgpu_cmd_demo(int argc, char **argv);
int mgpu_cmd_bench(int argc, char **argv);
int mgpu_cmd_trace(int argc, char **argv);
/* mgpu demo mandelbrot (tools/demo-mandelbrot.c); argv[1] is "mandelbrot". */
int mgpu_demo_mandelbrot(int argc, char **argv);
int mgpu_cmd_topo(int argc, char **argv);
int mgpu_cmd_store(int argc, char **argv);

/* Draws the timeline of trace file in into out (.png or .svg); prints a
 * line saying what it drew unless quiet. Returns 0 or 1 (message printed). */
int mgpu_trace_view(const char *in, const char *out, const char *title,
                    int width, int quiet);

/* Prints "mgpu: what: MGPU_EXXX (message): detail" to stderr; returns 1. */
int mgpu_cmd_fail(const char *what, int rc);

/* mgpu_init(NULL), reporting a failure; returns 0 or 1. */
int mgpu_cmd_init(void);

/* The path of helper program name (tools/helpers.c) into out; returns 1
 * when it is there and executable, 0 when not (out still holds the path
 * that was looked at, for the message). */
int mgpu_cmd_helper_path(const char *name, char *out, size_t len);

/* Whether this build made helper name (CMake's list MGPU_BUILT_HELPERS):
 * a missing one is then said to be missing, not "not built". */
int mgpu_cmd_helper_built(const char *name);

/* The MPIs a peer may be built against: Open MPI (run with mpirun) and
 * MPICH (run with mpiexec.mpich). The MPI CMake found builds the peers
 * named name; where that is Open MPI and mpicc.mpich is installed beside
 * it, each is built again against MPICH as name_mpich; where it is MPICH,
 * its peers are MPICH's and Open MPI has none. */
typedef enum mgpu_cmd_mpi { MGPU_CMD_OPEN_MPI, MGPU_CMD_MPICH } mgpu_cmd_mpi;

/* "Open MPI" or "MPICH", for the rows of a benchmark. */
const char *mgpu_cmd_mpi_name(mgpu_cmd_mpi mpi);

/* The peer program of MPI mpi (the helper named name, MPICH's name_mpich)
 * and its launcher, to run it on `ranks` ranks: 1 with its path in out
 * when both are there, else 0 with why filled in (missing, not built, no
 * launcher). MPICH's ranks poll without yielding: it is not run on more
 * ranks than CPUs, where a step takes milliseconds. */
int mgpu_cmd_mpi_peer(mgpu_cmd_mpi mpi, const char *name, int ranks,
                      char *out, size_t len, char *why, size_t wlen);

/* Starts peer on `ranks` local ranks of MPI mpi (mpirun --oversubscribe,
 * allowed as root; mpiexec.mpich), ended after timeout_s seconds (killed
 * 10 s later if it is still there), with args, for reading its standard output; the caller pcloses it. NULL when
 * it cannot start. */
FILE *mgpu_cmd_mpirun(mgpu_cmd_mpi mpi, int ranks, int timeout_s,
                      const char *peer, const char *args);

/* Ends a peer started by mgpu_cmd_mpirun (figures: whether the caller read
 * the figures it wanted): 0 when it exited 0 with them, else -1 with why
 * filled in (timed out, exited with a status, ended by a signal, printed
 * no figure). The caller then drops whatever figures it read. */
int mgpu_cmd_mpi_close(FILE *f, int figures, char *why, size_t wlen);

#endif /* MGPU_TOOLS_CMD_H */
