/*
 * app/build-info.c: lt_build_info (lutra.h), the lines `lutra --version` and
 * lt.build_info() show: core's (version, CPU, CUDA: core/build-info.h) and
 * then the collectives' MPI line (comm/comm.h). Assembled here, above both,
 * as core may not call comm.
 */
#include "lutra.h"
#include "comm/comm.h"
#include "core/build-info.h"

#include <stdio.h>

const char *lt_build_info(void) {
  static char buf[2560];
  snprintf(buf, sizeof buf, "%s\n%s", lt_core_build_info(), lt_comm_build_info());
  return buf;
}
