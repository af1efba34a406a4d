/* The flight recorder: a small ring of the recent operations of every
 * device, always on, for the message of a wait that ran out (which device
 * did not come, and what it did last) and for mgpu_flight_recorder_dump.
 *
 * The layers record an operation where it is issued (the calling thread,
 * not the worker that later runs it): a launch, copy, memset, event record
 * or wait, collective, barrier, channel message, device function or pool
 * task, with its name (a static string), bytes and stream. One record is an
 * atomic increment of the device's count and a few relaxed stores into the
 * slot it picks; no lock, no allocation, tracing on or off.
 *
 * Threads: any thread records at any time. A slot is published by a release
 * store of its sequence number, written last; a reader takes the slot only
 * when it reads the same number before and after the fields, so a slot
 * being overwritten meanwhile is skipped, never printed torn.
 */
#ifndef MGPU_OBS_FLIGHT_H
#define MGPU_OBS_FLIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "mgpu/trace.h"

/* Operations kept per device. */
#define MGPU__FLIGHT_SLOTS MGPU_FLIGHT_RECORDER_OPS

/* Records operation op (a static string) of bytes bytes on stream (a public
 * stream handle, 0 for none) of device dev. Dropped for a device outside
 * [0, MGPU_MAX_DEVICES). */
void mgpu__flight_record(int dev, const char *op, uint64_t bytes,
                         uintptr_t stream);

/* Writes the last (at most n) operations of device dev into out, newest
 * first, as "op 4096 B stream 0x.. 12 ms ago; ...", or "no operation
 * recorded". Returns out. */
char *mgpu__flight_format(int dev, int n, char *out, size_t size);

/* Operations of each device a wait's detail shows. */
#define MGPU__FLIGHT_DETAIL 3

/* Writes "device 2 (last: op ...; op ...), device 3 (last: ...)" for the n
 * devices of devs, each with its last MGPU__FLIGHT_DETAIL operations, into
 * out (cut to size). Returns out. */
char *mgpu__flight_list(const int *devs, int n, char *out, size_t size);

/* Forgets every record (mgpu_init: device numbers may mean other devices). */
void mgpu__flight_reset(void);

#endif /* MGPU_OBS_FLIGHT_H */
