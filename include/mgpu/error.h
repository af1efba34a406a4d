/* mgpu error codes.
 *
 * Every fallible call returns 0 or one of the negative codes below. One X-macro
 * list defines the codes, their names and their messages, so that the enum,
 * mgpu_strerror() and mgpu_err_name() cannot drift apart.
 *
 * The code says what kind of failure it was; mgpu_error_detail() says which
 * device, buffer, offset or size was wrong. The detail is thread-local: it is
 * the message of the last failure on the calling thread.
 */
#ifndef MGPU_ERROR_H
#define MGPU_ERROR_H

#include "mgpu/visibility.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MGPU_ERRNO_MAP(XX)                                                    \
  XX(EINVAL, -1, "invalid argument")                                          \
  XX(ENOMEM, -2, "out of memory")                                             \
  XX(ENODEV, -3, "no such device")                                            \
  XX(ENOTSUP, -4, "operation not supported")                                  \
  XX(ENOINIT, -5, "mgpu is not initialized")                                  \
  XX(EALREADY, -6, "already initialized, running or done")                    \
  XX(EBADHANDLE, -7, "invalid or NULL handle")                                \
  XX(EFREED, -8, "handle used after it was freed or destroyed")               \
  XX(EWRONGDEV, -9, "handle belongs to another device")                       \
  XX(ERANGE, -10, "offset or size out of bounds")                             \
  XX(EOVERLAP, -11, "source and destination overlap")                         \
  XX(EBACKEND, -12, "backend (driver) error")                                 \
  XX(ETIMEDOUT, -13, "timed out")                                             \
  XX(EAGAIN, -14, "not ready yet")                                            \
  XX(ECANCELED, -15, "canceled")                                              \
  XX(ECLOSED, -16, "closed")                                                  \
  XX(EDEPFAIL, -17, "a task this one depends on failed")                      \
  XX(EMISMATCH, -18, "arguments disagree across devices")                     \
  XX(EIO, -19, "input/output error")                                          \
  XX(EPLUGIN, -20, "backend plugin could not be loaded")                     \
  XX(EEXIST, -21, "name already taken")                                      \
  XX(ENOENT, -22, "no such object")                                          \
  XX(EACCES, -23, "permission denied")                                       \
  XX(EREADONLY, -24, "buffer is read-only")                                  \
  XX(ESTORE, -25, "store daemon unreachable, restarted or died")             \
  XX(EDEADLK, -26, "the wait would never end (a cycle of waits)")            \
  XX(EBUSY, -27, "not allowed from this thread now")                         \
  XX(EFORK, -28, "mgpu was initialized before this process was forked")      \
  XX(EDEVLOST, -29, "the device was lost")

typedef enum mgpu_errno {
#define MGPU__ERRNO_ENUM(name, value, msg) MGPU_##name = (value),
  MGPU_ERRNO_MAP(MGPU__ERRNO_ENUM)
#undef MGPU__ERRNO_ENUM
  MGPU_OK = 0
} mgpu_errno;

/* A static string describing the code ("out of memory"); never NULL. */
MGPU_EXTERN const char *mgpu_strerror(int code);

/* The code's name ("MGPU_ENOMEM"); never NULL. */
MGPU_EXTERN const char *mgpu_err_name(int code);

/* The calling thread's last detailed error message, or "" if none. The string
 * is owned by the library and valid until the thread's next failing call. */
MGPU_EXTERN const char *mgpu_error_detail(void);

/* Forget the calling thread's last detail. */
MGPU_EXTERN void mgpu_error_clear(void);

#ifdef __cplusplus
}
#endif
#endif /* MGPU_ERROR_H */
