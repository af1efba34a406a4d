/* Binding of device host threads to cores near their device. (Being
 * written: until then threads are left where the OS puts them.) */
#include "core/internal.h"

void mgpu__topo_bind_current_thread(int dev) { (void)dev; }
