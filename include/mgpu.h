/* mgpu: a multi-GPU runtime for C.
 *
 * The one header a user includes. Each area has its own header under mgpu/;
 * docs/API.md is the guide.
 */
#ifndef MGPU_H
#define MGPU_H

#include "mgpu/version.h"
#include "mgpu/error.h"
#include "mgpu/core.h"
#include "mgpu/metrics.h"
#include "mgpu/interop.h"
#include "mgpu/copy.h"
#include "mgpu/topo.h"
#include "mgpu/part.h"
#include "mgpu/sched.h"
#include "mgpu/coll.h"
#include "mgpu/chan.h"
#include "mgpu/graph.h"
#include "mgpu/trace.h"
#include "mgpu/store.h"

#endif /* MGPU_H */
