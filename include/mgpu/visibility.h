/* Symbol export for the mgpu libraries. The libraries are built with hidden
 * visibility; only names marked MGPU_EXTERN are exported. */
#ifndef MGPU_VISIBILITY_H
#define MGPU_VISIBILITY_H

#if defined(MGPU_BUILDING) && defined(__GNUC__)
#define MGPU_EXTERN __attribute__((visibility("default")))
#else
#define MGPU_EXTERN
#endif

#endif /* MGPU_VISIBILITY_H */
