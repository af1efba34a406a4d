/* What every fuzz target shares: the libFuzzer entry points, and a check that
 * aborts with a message (so a replay outside libFuzzer fails loudly too). */
#ifndef MGPU_FUZZ_H
#define MGPU_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FUZZ_CHECK(expr)                                                     \
  do {                                                                       \
    if (!(expr)) {                                                           \
      fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__,  \
              #expr);                                                        \
      abort();                                                               \
    }                                                                        \
  } while (0)

#endif /* MGPU_FUZZ_H */
