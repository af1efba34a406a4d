/* The module interface (include/mgpu/module.h), the seams a module such as
 * libmgpu_mpi reaches the core through: the one table of environment
 * variables (a name outside it is refused), the allocator (a fault site like
 * the core's) and the resolved view of a buffer. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core-internal.h"
#include "mgpu/module.h"
#include "task.h"
#include "util/fault.h"

TEST_IMPL(env_refuses_unknown_name) {
  /* Set in the environment, but not a line of the table: refused. */
  ASSERT_EQ(setenv("MGPU_NOT_A_VARIABLE", "1", 1), 0);
  ASSERT(mgpu_module_getenv("MGPU_NOT_A_VARIABLE") == NULL);
  ASSERT_DETAIL_HAS("MGPU_NOT_A_VARIABLE");
  ASSERT_DETAIL_HAS("table of variables");
  ASSERT(mgpu_module_getenv(NULL) == NULL);
  ASSERT(mgpu_module_getenv("HOME") == NULL);
  /* The library's own reader: an assertion in debug builds, NULL else. */
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) _exit(mgpu__env("MGPU_NOT_A_VARIABLE") == NULL ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
#ifdef NDEBUG
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
#else
  ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
#endif
  unsetenv("MGPU_NOT_A_VARIABLE");
  return 0;
}

TEST_IMPL(env_gives_module_variables_from_table) {
  /* The MPI module's variables: the environment's value, else the table's
   * default (which the module no longer keeps itself). */
  const struct {
    const char *name, *def;
  } mpi[] = {{"MGPU_MPI_TIMEOUT_MS", "30000"}, {"MGPU_MPI_CHUNK", "1M"},
             {"MGPU_MPI_STAGE", "0"}, {"MGPU_MPI_CUDA_AWARE", "auto"},
             {"MGPU_MPI_RANKS_PER_NODE", NULL}};
  for (size_t i = 0; i < sizeof mpi / sizeof mpi[0]; i++) {
    unsetenv(mpi[i].name);
    const char *v = mgpu_module_getenv(mpi[i].name);
    if (mpi[i].def == NULL) {
      ASSERT(v == NULL);
    } else {
      ASSERT(v != NULL && strcmp(v, mpi[i].def) == 0);
    }
    ASSERT_EQ(setenv(mpi[i].name, "", 1), 0); /* empty: unset */
    v = mgpu_module_getenv(mpi[i].name);
    ASSERT(mpi[i].def == NULL ? v == NULL : strcmp(v, mpi[i].def) == 0);
    ASSERT_EQ(setenv(mpi[i].name, "1234", 1), 0);
    v = mgpu_module_getenv(mpi[i].name);
    ASSERT(v != NULL && strcmp(v, "1234") == 0);
    unsetenv(mpi[i].name);
  }
  /* The library's other readers ask the same table: the store, the
   * launcher's local rank, a config variable. */
  const char *others[] = {"MGPU_STORE_TRUST", "MGPU_STORE_CAPACITY",
                          "XDG_RUNTIME_DIR", "SLURM_LOCALID",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "MGPU_LOG"};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    char *saved = getenv(others[i]) ? strdup(getenv(others[i])) : NULL;
    ASSERT_EQ(setenv(others[i], "someone", 1), 0);
    const char *v = mgpu__env(others[i]);
    ASSERT(v != NULL && strcmp(v, "someone") == 0);
    ASSERT(strcmp(mgpu_module_getenv(others[i]), "someone") == 0);
    unsetenv(others[i]);
    ASSERT(mgpu__env(others[i]) == NULL);
    if (saved != NULL) setenv(others[i], saved, 1);
    free(saved);
  }
  return 0;
}

TEST_IMPL(alloc_is_a_fault_site) {
  ASSERT_OK(mgpu__fault_set("", NULL, 0));
  void *p = mgpu_module_malloc(64);
  void *q = mgpu_module_calloc(4, 16);
  ASSERT(p != NULL && q != NULL);
  ASSERT_EQ(mgpu__fault_calls(MGPU__FAULT_ALLOC), 2);
  for (int i = 0; i < 16; i++) ASSERT_EQ(((unsigned char *)q)[i], 0);
  mgpu_module_free(p);
  mgpu_module_free(q);
  mgpu_module_free(NULL);
  /* The 1st and 2nd allocations after the rule fail, as the core's do. */
  ASSERT_OK(mgpu__fault_set("alloc:1", NULL, 0));
  ASSERT(mgpu_module_malloc(64) == NULL);
  ASSERT_OK(mgpu__fault_set("alloc:1", NULL, 0));
  ASSERT(mgpu_module_calloc(4, 16) == NULL);
  ASSERT_EQ(mgpu__fault_fired(MGPU__FAULT_ALLOC), 1);
  ASSERT_OK(mgpu__fault_set("", NULL, 0));
  return 0;
}

TEST_IMPL(buffer_view_in_one_lookup) {
  ASSERT_OK(mgpu_init(NULL));
  /* The last device: not device 0 wherever there are two or more. */
  int dev = mgpu_device_count() - 1;
  ASSERT(dev >= 0);
  mgpu_buffer *b = NULL;
  ASSERT_OK(mgpu_malloc(&b, dev, 4096));
  mgpu_buffer_view v;
  memset(&v, 0, sizeof v);
  ASSERT_OK(mgpu_module_buffer_view(b, &v));
  ASSERT(v.handle == b);
  ASSERT(v.ptr == mgpu_buffer_ptr(b) && v.ptr != NULL);
  ASSERT_EQ(v.size, 4096);
  ASSERT_EQ(v.device, dev);
  ASSERT_EQ(v.kind, MGPU_MEM_DEVICE);
  ASSERT_EQ(v.readonly, 0);
  ASSERT_ERR(MGPU_EINVAL, mgpu_module_buffer_view(b, NULL));
  ASSERT_OK(mgpu_free(b));
  /* A freed or NULL handle: refused, the view left as it was. */
  mgpu_buffer_view before = v;
  ASSERT_ERR(MGPU_EFREED, mgpu_module_buffer_view(b, &v));
  ASSERT_DETAIL_HAS("freed");
  ASSERT_ERR(MGPU_EBADHANDLE, mgpu_module_buffer_view(NULL, &v));
  ASSERT(memcmp(&before, &v, sizeof v) == 0);
  ASSERT_OK(mgpu_shutdown());
  return 0;
}

TEST_LIST_BEGIN
TEST_ENTRY(env_refuses_unknown_name)
TEST_ENTRY(env_gives_module_variables_from_table)
TEST_ENTRY(alloc_is_a_fault_site)
TEST_ENTRY(buffer_view_in_one_lookup)
TEST_LIST_END
