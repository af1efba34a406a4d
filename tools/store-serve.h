/* The daemon's command line, shared by mgpud and `mgpu store serve`
 * (tools/store-serve.c). */
#ifndef MGPU_TOOLS_STORE_SERVE_H
#define MGPU_TOOLS_STORE_SERVE_H

/* Parses [--socket PATH] [--capacity SIZE] [--allow-group GROUP], calls
 * mgpu_init and serves until stopped. Returns the exit status: 0 after a
 * clean stop, 1 on failure, 2 on bad arguments. argv[0] names the command. */
int mgpu_store_serve_main(int argc, char **argv);

#endif
