/* The version of the library actually linked. */
#include "mgpu/version.h"

unsigned mgpu_version(void) { return MGPU_VERSION_HEX; }
const char *mgpu_version_string(void) { return MGPU_VERSION_STRING; }
