/* mgpud: the store daemon (docs/store.md). The same as `mgpu store serve`.
 *
 *   mgpud [--socket PATH] [--capacity SIZE] [--allow-group GROUP]
 *
 * Serves the devices MGPU_DEVICES names until SIGINT or SIGTERM. Logs
 * connections, refusals and closed clients on stderr (MGPU_LOG=warn keeps
 * only refusals and errors). */
#include "../store-serve.h"

int main(int argc, char **argv) { return mgpu_store_serve_main(argc, argv); }
