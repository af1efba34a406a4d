/* The multi-device Jacobi solver (jacobi.h) run twice on every open device
 * (at most 4): op by op, and as a captured graph of two iterations
 * launched again and again; both grids must equal the single-threaded
 * reference exactly (the same sums in the same order). */
#include <math.h>
#include <stdio.h>

#include "check.h"
#include "jacobi.h"

enum { NX = 128, NY = 96, ITERS = 40 };

static int compare(const float *got, const float *want, const char *what) {
  for (int i = 0; i < NX * NY; i++)
    if (got[i] != want[i]) {
      fprintf(stderr, "%s: row %d column %d is %g, the reference %g\n", what,
              i / NX, i % NX, (double)got[i], (double)want[i]);
      return 1;
    }
  return 0;
}

int main(void) {
  CHECK(mgpu_init(NULL));
  int ndev = mgpu_device_count();
  if (ndev > 4) ndev = 4;
  static float want[NX * NY], got[NX * NY];
  jacobi_initial(want, NX, NY);
  jacobi_reference(want, NX, NY, ITERS);

  jacobi j;
  CHECK(jacobi_init(&j, ndev, NX, NY));
  CHECK(jacobi_run(&j, ITERS));
  CHECK(jacobi_sync(&j));
  CHECK(jacobi_gather(&j, got));
  int bad = compare(got, want, "op by op");
  jacobi_free(&j);

  CHECK(jacobi_init(&j, ndev, NX, NY));
  mgpu_graph *g;
  mgpu_graph_exec *x;
  CHECK(jacobi_capture(&j, &g));
  CHECK(mgpu_graph_instantiate(g, &x));
  for (int it = 0; it < ITERS; it += 2) CHECK(mgpu_graph_launch(x, j.s[0]));
  CHECK(mgpu_stream_synchronize(j.s[0]));
  CHECK(mgpu_graph_exec_synchronize(x));
  CHECK(jacobi_gather(&j, got));
  bad |= compare(got, want, "graph");
  printf("jacobi %dx%d, %d iterations on %d device(s): graph of %d nodes, "
         "%s; value at row 8, column %d: %.6f\n", NX, NY, ITERS, ndev,
         mgpu_graph_node_count(g), bad ? "MISMATCH" : "both match the "
         "reference", NX / 2, (double)got[8 * NX + NX / 2]);
  CHECK(mgpu_graph_exec_destroy(x));
  CHECK(mgpu_graph_destroy(g));
  jacobi_free(&j);
  CHECK(mgpu_shutdown());
  return bad;
}
